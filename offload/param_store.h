// ParamStore: stage-3 parameter shards (compute-dtype bytes, one tensor per layer) on the
// NVMe tier (offload_param.device = nvme), read ahead of use by the engine's gathers and
// rewritten once per step after the optimizer (as ZeRO-Infinity keeps parameters on NVMe).
//
// Protocol. The constructor sizes a pool of buffer_count pinned buffers of chunk_bytes
// (offload_param.buffer_size elements, rounded up to 4 KiB), checks it against the budget
// (naming the minimum), creates the directory and the checksummed swap files with their
// blocks reserved, so a full device fails here. A tensor larger than a buffer is split into
// chunks: nothing is asserted on size. Each chunk's committed bytes are in one file; a write
// goes to a spare file of the chunk's length. With options.spares 0 every chunk has its own
// spare (two generations of everything); with n > 0 the chunks of one length share n spares.
// write(t, src) writes tensor t's new bytes into spares; commit() makes every write since
// the last commit current (commit(t): tensor t's), abort() drops them, so a step that fails
// halfway leaves the last good state readable. When a write finds no spare free, a chunk of
// that length whose write has landed is committed early to free its old file: the tensor it
// belongs to is then ahead of the last commit, and if the write is dropped (abort(), or its
// own write failing) the tensor is stale, its files mixing two states: stale(t) says so,
// reads of it are refused naming why (read_async on the caller's thread, not as the
// worker's sticky failure), and a whole write of it and a commit make it whole
// (parameter shards are the compute-dtype copy of the optimizer's masters, so the engine
// rebuilds them from those). read(t, fn) reads the committed files chunk by chunk (up to
// buffer_count chunks in flight), verifies checksums and hands each chunk to
// fn(offset, data, bytes) in offset order on the calling thread; a mismatch is an error
// naming the tensor, the file and the block. Files are removed on destruction.
//
// Queued requests. With options.device set, the store has an I/O worker of its own (a thread
// private to it; io_worker.h): read_async(t, pieces) scatters tensor t's bytes into the
// caller's buffers, write_async(t, src, ledger) writes src (then hands src back to the
// ledger, whether the write succeeded or not), commit_async() commits; each returns a ticket
// that a device stream waits on (wait_on) or the caller does (wait). Ordering is the store's
// guarantee: requests run in submission order, so a write queued before a commit, and a commit
// before a read of the same tensor, are on disk before the next one starts; a blocking call
// (read, write, write_from, commit, abort) first waits for every request queued before it.
// The first request that fails makes the failure sticky: the later ones are skipped (a
// write's buffer still goes back), succeeded(t) is false from that ticket on, and
// synchronize() waits for the queue and rethrows it. Nothing the caller runs executes on the
// worker: requests are data (tensor, buffers, ledger). Thread-safe: blocking calls and
// requests run one at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "offload/io_worker.h"
#include "offload/swap_footprint.h"

namespace strata {
class Tracer;
}

namespace strata::offload {

class MemoryLedger;

struct ParamStoreOptions {
  std::string dir;                                 // created if missing (one per rank)
  std::uint64_t chunk_bytes = 200000000;           // offload_param.buffer_size x element bytes
  int buffer_count = 5;                            // offload_param.buffer_count
  std::uint64_t budget_bytes = ~std::uint64_t{0};  // host bytes the buffers may take
  bool lock_memory = true;
  unsigned queue_depth = 32;             // aio.queue_depth
  unsigned submit_batch = 8;             // pieces per io_uring_submit (aio.single_submit: 1)
  std::uint32_t block_bytes = 1u << 20;  // aio.block_size
  std::uint64_t spares = 0;              // spare files per chunk length (offload_param.spare_chunks); 0: one per chunk
  device::Device* device = nullptr;      // set: queued requests (a worker thread), signalled to its streams
  Tracer* tracer = nullptr;              // optional: "nvme read", "nvme write" rows of queued requests
};

struct ParamTensor {
  std::string name;         // "layer 3", for messages and file names
  std::uint64_t bytes = 0;  // this rank's shard in compute dtype
};

struct ParamStoreStats {  // cumulative since creation
  std::uint64_t bytes_read = 0, bytes_written = 0;
  double read_seconds = 0, write_seconds = 0;  // wall time inside read() / write()
};

class ParamStore {
 public:
  ParamStore(const ParamStoreOptions& options, std::vector<ParamTensor> tensors);
  ~ParamStore();
  ParamStore(const ParamStore&) = delete;
  ParamStore& operator=(const ParamStore&) = delete;

  using ChunkFn = std::function<void(std::uint64_t offset, const void* data, std::uint64_t bytes)>;
  void read(std::size_t tensor, const ChunkFn& fn);
  void write(std::size_t tensor, const void* src);
  // Writes tensor `tensor` from `src_tensor` of another store (same byte size), chunk by
  // chunk through this store's buffers: no other memory is needed.
  void write_from(std::size_t tensor, ParamStore& src, std::size_t src_tensor);
  void commit();
  void commit(std::size_t tensor);  // tensor's write since the last commit only
  void abort();
  // Tensor t's files mix two states (a write committed in part was dropped): write it whole
  // and commit before reading it.
  bool stale(std::size_t tensor) const;

  // Queued requests (options.device set; see the protocol above).
  using Ticket = IoWorker::Ticket;
  struct Piece {  // the next `bytes` bytes of a tensor go to dst
    void* dst = nullptr;
    std::uint64_t bytes = 0;
  };
  // The pieces, in order, cover the tensor's bytes exactly.
  Ticket read_async(std::size_t tensor, std::vector<Piece> into);
  // src stays untouched until the request completes; then, with a ledger, ledger->retire(src).
  Ticket write_async(std::size_t tensor, const void* src, MemoryLedger* retire_to = nullptr);
  Ticket commit_async();
  Ticket commit_async(std::size_t tensor);
  void wait_on(device::Stream& stream, Ticket t);
  void wait(Ticket t);
  bool succeeded(Ticket t) const;  // request t ran with no failure, here or before it
  void synchronize();              // every queued request completed; rethrows the first failure

  std::uint64_t buffer_bytes() const noexcept;
  int buffer_count() const noexcept;
  std::uint64_t file_bytes() const noexcept;  // committed and spare files, headers included
  std::size_t chunks() const noexcept;
  // The committed file holding byte `offset` of `tensor`.
  std::string file_of(std::size_t tensor, std::uint64_t offset) const;
  ParamStoreStats stats() const;

  static std::uint64_t min_budget_bytes(const ParamStoreOptions& options, const std::vector<ParamTensor>& tensors);
  // What a store for these tensors takes, computed without creating it: the buffers the
  // constructor allocates and the swap files on disk (spares included), headers included.
  // Refuses, as the constructor does, a buffer count below 1 or a budget below one buffer.
  using Footprint = SwapFootprint;
  static Footprint footprint(const ParamStoreOptions& options, const std::vector<ParamTensor>& tensors);

 private:
  struct Impl;
  void settle() const noexcept;  // waits for every request queued so far
  void read_now(std::size_t tensor, const ChunkFn& fn);
  void write_now(std::size_t tensor, const void* src);
  void commit_now(std::size_t tensor, bool all);
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::offload
