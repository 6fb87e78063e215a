// Engine: asynchronous reads and writes of arbitrarily large file regions on io_uring
// (liburing). DeepSpeed's DeepNVMe uses libaio with one context per thread; Strata uses
// one ring per Engine, driven by one io thread.
//
// Protocol: create() sets up the ring (and SQPOLL, sparse fixed-file and fixed-buffer
// tables where the kernel allows) and starts the io thread. open() gives Files. read() and
// write() queue a request and return at once; the io thread splits each request into
// block_bytes pieces and keeps queue_depth pieces in flight across all requests (round
// robin between requests, so reads and writes progress together), submitting every
// submit_batch prepared pieces. Short transfers are resubmitted for the remainder, EINTR
// and EAGAIN are retried; a failure ends the request (no new pieces; those in flight drain
// first) with the failure at the lowest offset, its message naming the path, offset,
// length and errno text. The caller
// owns the buffer and keeps it alive and untouched until the request completes. A buffer
// inside a registered region (register_buffer, BufferPool) is used with READ/WRITE_FIXED.
// The destructor waits for every queued request to complete.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "io/file.h"
#include "io/future.h"
#include "io/status.h"

namespace strata::io {

namespace detail {
class Reactor;
struct Registry;
}  // namespace detail

struct EngineOptions {
  unsigned queue_depth = 32;             // pieces in flight, 1..4096
  std::uint32_t block_bytes = 1u << 20;  // piece size: a multiple of 4 KiB, at most 1 GiB
  unsigned submit_batch = 8;             // prepared pieces per io_uring_submit, >= 1
  bool sqpoll = false;                   // a kernel thread polls the submission queue
  unsigned sqpoll_idle_ms = 100;
  unsigned max_files = 1024;   // fixed-file slots (0: none); swap files are many
  unsigned max_buffers = 256;  // fixed-buffer slots (0: none)
};

struct EngineStats {
  std::uint64_t requests = 0;  // completed requests
  std::uint64_t failed_requests = 0;
  std::uint64_t pieces = 0;  // SQEs for data (resubmissions included)
  std::uint64_t fixed_buffer_pieces = 0;
  std::uint64_t fixed_file_pieces = 0;
  std::uint64_t buffered_pieces = 0;    // on a buffered descriptor (tails, unaligned, no O_DIRECT)
  std::uint64_t submit_calls = 0;       // io_uring_submit / submit_and_wait calls
  std::uint64_t short_transfers = 0;    // resubmitted remainders
  std::uint64_t retries = 0;            // EINTR / EAGAIN resubmissions
  std::uint64_t interrupted_calls = 0;  // io_uring_enter calls ended by a signal (EINTR), repeated
  std::uint64_t max_in_flight = 0;      // most pieces in flight at once
  std::uint64_t bytes_read = 0;
  std::uint64_t bytes_written = 0;
};

class Engine {
 public:
  static Result<Engine> create(const EngineOptions& options = {});
  Engine(Engine&&) noexcept;
  Engine& operator=(Engine&&) noexcept;
  ~Engine();

  const EngineOptions& options() const noexcept;
  bool sqpoll() const noexcept;  // SQPOLL actually in use

  Result<File> open(const std::string& path, const OpenOptions& options = {});

  IoFuture read(const File& file, std::uint64_t offset, void* dst, std::uint64_t bytes);
  IoFuture write(const File& file, std::uint64_t offset, const void* src, std::uint64_t bytes);
  void read(const File& file, std::uint64_t offset, void* dst, std::uint64_t bytes, Callback done);
  void write(const File& file, std::uint64_t offset, const void* src, std::uint64_t bytes, Callback done);

  // Registers [ptr, ptr + bytes) as a fixed buffer (pinned by the kernel, counted against
  // RLIMIT_MEMLOCK without CAP_IPC_LOCK). Returns the slot, or -errno (no free slot:
  // -ENOBUFS; table unsupported: -EOPNOTSUPP). Unregister before freeing the memory and
  // only when no request on it is in flight.
  int register_buffer(void* ptr, std::size_t bytes);
  void unregister_buffer(int slot) noexcept;

  EngineStats stats() const noexcept;
  // For Files and pools that unregister themselves after the engine may be gone.
  const std::shared_ptr<detail::Registry>& registry() const noexcept { return registry_; }

 private:
  Engine(std::unique_ptr<detail::Reactor> reactor, std::shared_ptr<detail::Registry> registry);
  void shutdown() noexcept;

  std::unique_ptr<detail::Reactor> reactor_;
  std::shared_ptr<detail::Registry> registry_;
};

}  // namespace strata::io
