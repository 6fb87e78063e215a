// The io thread of an Engine: owns the ring, turns requests into block-size pieces, keeps
// queue_depth of them in flight and completes requests (see engine.h for the protocol).
//
// Threads: submit() and the slot functions are called from any thread; everything else
// runs on the io thread. New requests go through `inbox_` (mutex) and a doorbell: an
// eventfd whose read is kept armed in the ring, so the io thread sleeps in one place
// (io_uring_submit_and_wait) whether it waits for I/O or for new work.
#pragma once

#include <liburing.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "io/engine.h"
#include "io/future.h"
#include "io/status.h"

namespace strata::io::detail {

struct FileState;

enum class Op : std::uint8_t { read, write };

struct Request {
  Op op = Op::read;
  std::shared_ptr<FileState> file;  // keeps the descriptors open while in flight
  std::uint64_t offset = 0;
  std::byte* buf = nullptr;
  std::uint64_t bytes = 0;
  std::uint64_t primary_bytes = 0;  // leading part on the primary (direct) descriptor
  int buf_index = -1;               // fixed-buffer slot holding the whole region, or -1
  std::uint64_t issued = 0;         // bytes handed to pieces so far
  std::uint64_t done = 0;           // bytes completed
  unsigned in_flight = 0;
  bool queued = false;  // in the round-robin queue
  int err = 0;          // the failure at the lowest offset (see Reactor::fail)
  std::uint64_t fail_offset = 0;
  std::string message;
  std::shared_ptr<FutureState> future;
  Callback callback;
};

// One SQE's worth of a request; resubmitted in place after a short transfer.
struct Piece {
  Request* req = nullptr;
  std::uint64_t offset = 0;  // file offset of the next byte
  std::byte* buf = nullptr;
  std::uint32_t len = 0;    // bytes still to transfer
  std::uint32_t total = 0;  // piece length as issued
  bool buffered = false;    // on the buffered descriptor (tail, unaligned, or after a short transfer)
  unsigned retries = 0;
};

class Reactor {
 public:
  static Result<std::unique_ptr<Reactor>> create(const EngineOptions& options);
  ~Reactor();  // drains and joins (shutdown())
  Reactor(const Reactor&) = delete;
  Reactor& operator=(const Reactor&) = delete;

  const EngineOptions& options() const noexcept { return options_; }
  bool sqpoll() const noexcept { return sqpoll_; }
  void submit(std::unique_ptr<Request> request);
  void shutdown() noexcept;

  int register_file(int fd);  // slot or -errno
  void unregister_file(int slot) noexcept;
  int register_buffer(void* ptr, std::size_t bytes);
  void unregister_buffer(int slot) noexcept;
  int find_buffer(const void* ptr, std::uint64_t bytes) const;  // slot or -1

  EngineStats stats() const noexcept;

 private:
  explicit Reactor(const EngineOptions& options);
  void run() noexcept;
  void take_inbox();
  void fill();
  void issue(Request* r);
  void prep(std::uint32_t index);
  io_uring_sqe* get_sqe();
  void submit_prepared(bool wait);
  void reap();
  void on_piece(std::uint32_t index, int res);
  void fail(Request* r, const Piece& p, int err, const std::string& what);
  void release_piece(std::uint32_t index);
  void finish(Request* r);
  void arm_doorbell();
  void ring_doorbell() noexcept;

  EngineOptions options_;
  io_uring ring_{};
  bool ring_ready_ = false;
  bool sqpoll_ = false;
  bool files_table_ = false;
  bool buffers_table_ = false;
  int doorbell_fd_ = -1;
  std::uint64_t doorbell_value_ = 0;
  std::thread thread_;
  std::thread::id thread_id_;

  std::mutex inbox_mutex_;
  std::vector<std::unique_ptr<Request>> inbox_;
  std::atomic<bool> stopping_{false};

  // io thread only
  std::deque<Request*> queue_;  // requests with pieces left to issue, round robin
  std::vector<Piece> pieces_;
  std::vector<std::uint32_t> free_pieces_;
  unsigned in_flight_ = 0;
  unsigned prepared_ = 0;   // SQEs prepared since the last submit
  std::uint64_t live_ = 0;  // requests taken from the inbox and not finished

  mutable std::mutex slot_mutex_;
  std::vector<bool> file_slots_;
  std::vector<bool> buffer_slots_;
  mutable std::shared_mutex buffers_mutex_;
  std::map<std::uintptr_t, std::pair<std::uintptr_t, int>> buffers_;  // start -> (end, slot)

  struct Counters {
    std::atomic<std::uint64_t> requests{0}, failed_requests{0}, pieces{0}, fixed_buffer_pieces{0}, fixed_file_pieces{0},
        buffered_pieces{0}, submit_calls{0}, short_transfers{0}, retries{0}, interrupted_calls{0}, max_in_flight{0},
        bytes_read{0}, bytes_written{0};
  };
  Counters counters_;
};

}  // namespace strata::io::detail
