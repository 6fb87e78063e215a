// ParamStore (see param_store.h): chunk layout, the committed and spare files per chunk, early
// commits when the spares run out, and reads kept buffer_count chunks deep.
#include "offload/param_store.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <mutex>

#include "io/aligned.h"
#include "io/buffer_pool.h"
#include "io/engine.h"
#include "io/swap_file.h"
#include "offload/detail/swap_files.h"
#include "offload/io_error.h"
#include "offload/ledger.h"
#include "runtime/core/error.h"
#include "runtime/core/trace.h"
#include "runtime/core/units.h"

namespace strata::offload {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::uint64_t chunk_bytes_for(const ParamStoreOptions& o, const std::vector<ParamTensor>& tensors) {
  std::uint64_t largest = 1;
  for (const auto& t : tensors) largest = std::max(largest, t.bytes);
  return io::align_up(std::max<std::uint64_t>(1, std::min(o.chunk_bytes, largest)));
}

// A chunk's swap files; its length counts bytes.
using Chunk = detail::SwapChunk;

detail::SwapLayout layout_for(const ParamStoreOptions& o, std::uint64_t chunk_bytes) {
  return {.chunk_units = chunk_bytes,
          .unit_bytes = 1,
          .element_bytes = 1,
          .block_bytes = o.block_bytes,
          .spares = o.spares};
}

std::vector<std::uint64_t> sizes_of(const std::vector<ParamTensor>& tensors) {
  std::vector<std::uint64_t> v;
  for (const auto& t : tensors) v.push_back(t.bytes);
  return v;
}

}  // namespace

struct ParamStore::Impl {
  ParamStoreOptions options;
  std::vector<ParamTensor> tensors;
  std::uint64_t chunk_bytes = 0;
  detail::SwapIo sio;        // engine and buffers: declared before the files, so destroyed after them
  detail::SwapChunks files;  // the chunks' swap files
  std::vector<io::PoolBuffer>& buffers = sio.buffers;
  std::vector<Chunk>& chunks = files.chunks;
  std::vector<std::size_t>& first_chunk = files.first;  // per tensor, plus the end
  // Per tensor: written, every chunk's spare holds a landed write since the last commit;
  // early, some chunks were committed ahead of the tensor's commit; stale, its committed files
  // mix two states (an early-committed write was dropped).
  std::vector<char> written, early, stale;
  std::atomic<std::size_t> stale_tensors{0};  // how many are stale: read_async's check without the lock
  mutable std::mutex mutex;
  ParamStoreStats stats;
  std::unique_ptr<IoWorker> worker;  // declared last: its queue drains before anything above goes

  // A chunk transfer in flight in one of the buffers.
  struct Pending {
    std::size_t chunk;
    std::size_t buffer;
    io::SwapOp op;
  };
  std::vector<std::size_t> all_buffers() const {  // as a free list, buffer 0 taken first
    std::vector<std::size_t> v;
    for (std::size_t b = buffers.size(); b-- > 0;) v.push_back(b);
    return v;
  }

  std::string where(const Chunk& c, const std::string& path) const {
    return str_cat("parameter shard of ", tensors[c.tensor].name, " (chunk ", c.index, ", bytes [", c.offset, ", ",
                   c.offset + c.length, "), file ", path, ") on the NVMe tier");
  }
  std::string where(const Chunk& c, detail::SlotRef s) const { return where(c, files.path(s)); }

  // Drops tensor t's uncommitted writes; if some of its chunks were committed early, its
  // files now mix two states.
  void drop_writes(std::size_t t) noexcept {
    for (std::size_t ci = first_chunk[t]; ci < first_chunk[t + 1]; ++ci) files.discard(ci);
    if (early[t] && !stale[t]) {
      stale[t] = 1;
      ++stale_tensors;
    }
    early[t] = written[t] = 0;
  }

  // Lends chunk ci a spare file as its `next`. With none free, a chunk of its length whose
  // write has landed (not busy(chunk)) is committed early, which frees its old file; false
  // when every such chunk is still busy (the caller waits for one and asks again).
  template <class Busy> bool lend(std::size_t ci, const Busy& busy) {
    if (files.acquire(ci)) return true;
    for (std::size_t j = 0; j < chunks.size(); ++j) {
      if (!chunks[j].has_next || chunks[j].klass != chunks[ci].klass || busy(j)) continue;
      files.commit(j);
      early[chunks[j].tensor] = 1;
      return files.acquire(ci);
    }
    return false;
  }
};

std::uint64_t ParamStore::min_budget_bytes(const ParamStoreOptions& o, const std::vector<ParamTensor>& tensors) {
  return chunk_bytes_for(o, tensors);
}

ParamStore::Footprint ParamStore::footprint(const ParamStoreOptions& o, const std::vector<ParamTensor>& tensors) {
  STRATA_CHECK(o.buffer_count >= 1, Errc::invalid_argument, "offload_param.buffer_count = ", o.buffer_count,
               ": use at least 1 (2 or more lets chunk reads overlap)");
  Footprint f;
  f.buffer_bytes = chunk_bytes_for(o, tensors);
  STRATA_CHECK(o.budget_bytes >= f.buffer_bytes, Errc::out_of_budget,
               "host tier: NVMe parameter offload needs at least ", format_bytes(f.buffer_bytes), " (", f.buffer_bytes,
               " B) of pinned host memory for one parameter buffer, but the budget leaves ",
               format_bytes(o.budget_bytes), " (", o.budget_bytes,
               " B): raise memory_budget.host (or the pinned budget) or lower offload_param.buffer_size");
  f.buffer_count = static_cast<int>(std::min<std::uint64_t>(o.buffer_count, o.budget_bytes / f.buffer_bytes));
  detail::count_swap_files(f, sizes_of(tensors), layout_for(o, f.buffer_bytes));
  return f;
}

ParamStore::ParamStore(const ParamStoreOptions& options, std::vector<ParamTensor> tensors)
    : impl_(std::make_unique<Impl>()) {
  auto& I = *impl_;
  I.options = options;
  I.tensors = std::move(tensors);
  STRATA_CHECK(!options.dir.empty(), Errc::invalid_argument, "parameter store: offload_param.nvme_path is empty");
  const Footprint f = footprint(options, I.tensors);  // refuses a buffer count or budget that cannot work
  I.chunk_bytes = f.buffer_bytes;
  const int count = f.buffer_count;
  detail::start_swap_io(I.sio, options.queue_depth, options.submit_batch, options.block_bytes, I.chunk_bytes, count,
                        options.lock_memory, "parameter store", "parameter buffers", f.file_count,
                        "offload_param.buffer_size");

  std::vector<std::string> names;
  for (const auto& t : I.tensors) names.push_back(t.name);
  I.files.create(
      *I.sio.engine, options.dir, "offload_param.nvme_path", names, sizes_of(I.tensors),
      layout_for(options, I.chunk_bytes), ".params.c",
      [&I](const Chunk& c, int gen) { return I.where(c, c.path[gen]); }, "NVMe tier (parameters)");
  I.written.assign(I.tensors.size(), 0);
  I.early.assign(I.tensors.size(), 0);
  I.stale.assign(I.tensors.size(), 0);
  if (options.device != nullptr) I.worker = std::make_unique<IoWorker>(*options.device);
}

// The worker finishes what is queued while everything its requests read is still whole.
ParamStore::~ParamStore() { impl_->worker.reset(); }

void ParamStore::read(std::size_t tensor, const ChunkFn& fn) {
  settle();
  read_now(tensor, fn);
}

void ParamStore::write(std::size_t tensor, const void* src) {
  settle();
  write_now(tensor, src);
}

void ParamStore::commit() {
  settle();
  commit_now(0, true);
}

void ParamStore::commit(std::size_t tensor) {
  settle();
  commit_now(tensor, false);
}

void ParamStore::abort() {
  settle();
  auto& I = *impl_;
  std::lock_guard<std::mutex> lock(I.mutex);
  for (std::size_t t = 0; t < I.tensors.size(); ++t) I.drop_writes(t);
}

bool ParamStore::stale(std::size_t tensor) const {
  settle();
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->stale.at(tensor) != 0;
}

void ParamStore::read_now(std::size_t tensor, const ChunkFn& fn) {
  auto& I = *impl_;
  std::lock_guard<std::mutex> lock(I.mutex);
  STRATA_CHECK(tensor < I.tensors.size(), Errc::invalid_argument, "parameter store: no tensor ", tensor);
  STRATA_CHECK(!I.stale[tensor], Errc::io, "parameter shard of ", I.tensors[tensor].name,
               " on the NVMe tier mixes two states: a write that had begun to commit (its spare files, "
               "offload_param.spare_chunks, ran out) was dropped. It must be written whole again; the engine rebuilds "
               "it from the optimizer's masters when it undoes a step, and otherwise refuses until a checkpoint is "
               "loaded: resume from the last checkpoint");
  STRATA_CHECK(!I.early[tensor], Errc::internal, "parameter store: read of ", I.tensors[tensor].name,
               " while its write is committed in part: commit or abort it first");
  const auto t0 = Clock::now();
  std::deque<Impl::Pending> inflight;
  std::size_t next = I.first_chunk[tensor];
  const std::size_t end = I.first_chunk[tensor + 1];
  std::vector<std::size_t> free_buffers = I.all_buffers();
  try {
    while (next < end || !inflight.empty()) {
      while (next < end && !free_buffers.empty()) {
        const std::size_t b = free_buffers.back();
        free_buffers.pop_back();
        inflight.push_back(
            {next, b, I.files.file(I.chunks[next].slot).swap_in(I.buffers[b].data(), I.buffers[b].bytes())});
        ++next;
      }
      Impl::Pending p = std::move(inflight.front());
      inflight.pop_front();
      const io::Status s = p.op.wait();
      free_buffers.push_back(p.buffer);
      const Chunk& c = I.chunks[p.chunk];
      STRATA_IO_CHECK(s, I.where(c, c.slot));
      fn(c.offset, I.buffers[p.buffer].data(), c.length);
      I.stats.bytes_read += c.length;
    }
  } catch (...) {
    for (auto& p : inflight) (void)p.op.wait();  // no transfer may outlive the error into a reused buffer
    I.stats.read_seconds += since(t0);
    throw;
  }
  I.stats.read_seconds += since(t0);
}

void ParamStore::write_now(std::size_t tensor, const void* src) {
  auto& I = *impl_;
  std::lock_guard<std::mutex> lock(I.mutex);
  STRATA_CHECK(tensor < I.tensors.size(), Errc::invalid_argument, "parameter store: no tensor ", tensor);
  I.drop_writes(tensor);  // an earlier uncommitted write of it is replaced
  const auto t0 = Clock::now();
  std::deque<Impl::Pending> inflight;
  std::vector<std::size_t> free_buffers = I.all_buffers();
  auto finish = [&] {
    Impl::Pending p = std::move(inflight.front());
    inflight.pop_front();
    const io::Status s = p.op.wait();
    free_buffers.push_back(p.buffer);
    const Chunk& c = I.chunks[p.chunk];
    STRATA_IO_CHECK(s, I.where(c, c.next));
  };
  auto busy = [&](std::size_t j) {
    return std::any_of(inflight.begin(), inflight.end(), [j](const Impl::Pending& p) { return p.chunk == j; });
  };
  try {
    for (std::size_t ci = I.first_chunk[tensor]; ci < I.first_chunk[tensor + 1]; ++ci) {
      while (!I.lend(ci, busy)) {  // its length's spares are all in writes still in flight
        STRATA_CHECK(!inflight.empty(), Errc::internal, "parameter store: no spare file for ",
                     I.where(I.chunks[ci], I.chunks[ci].slot));
        finish();
      }
      if (free_buffers.empty()) finish();
      const std::size_t b = free_buffers.back();
      free_buffers.pop_back();
      const Chunk& c = I.chunks[ci];
      auto& buf = I.buffers[b];
      std::memcpy(buf.data(), static_cast<const char*>(src) + c.offset, c.length);
      std::memset(buf.data() + c.length, 0, buf.bytes() - c.length);
      inflight.push_back({ci, b, I.files.file(c.next).swap_out(buf.data(), buf.bytes())});
      I.stats.bytes_written += c.length;
    }
    while (!inflight.empty()) finish();
  } catch (...) {
    for (auto& p : inflight) (void)p.op.wait();
    I.drop_writes(tensor);  // stale if some chunks were committed early
    I.stats.write_seconds += since(t0);
    throw;
  }
  I.written[tensor] = 1;
  I.stats.write_seconds += since(t0);
}

void ParamStore::write_from(std::size_t tensor, ParamStore& src, std::size_t src_tensor) {
  auto& I = *impl_;
  STRATA_CHECK(&src != this, Errc::invalid_argument, "parameter store: write_from needs another store");
  settle();
  std::lock_guard<std::mutex> lock(I.mutex);
  STRATA_CHECK(tensor < I.tensors.size(), Errc::invalid_argument, "parameter store: no tensor ", tensor);
  I.drop_writes(tensor);
  const auto t0 = Clock::now();
  std::size_t ci = I.first_chunk[tensor];
  std::uint64_t filled = 0;
  auto& buf = I.buffers[0];
  try {
    src.read(src_tensor, [&](std::uint64_t, const void* data, std::uint64_t n) {
      const char* p = static_cast<const char*>(data);
      while (n > 0) {
        STRATA_CHECK(ci < I.first_chunk[tensor + 1], Errc::invalid_argument,
                     "parameter store: write_from: ", I.tensors[tensor].name, " is smaller than its source");
        const Chunk& c = I.chunks[ci];
        const std::uint64_t take = std::min(n, c.length - filled);
        std::memcpy(buf.data() + filled, p, take);
        filled += take;
        p += take;
        n -= take;
        if (filled == c.length) {
          std::memset(buf.data() + c.length, 0, buf.bytes() - c.length);
          STRATA_CHECK(I.lend(ci, [](std::size_t) { return false; }), Errc::internal,
                       "parameter store: no spare file for ", I.where(c, c.slot));
          STRATA_IO_CHECK(I.files.file(c.next).swap_out(buf.data(), buf.bytes()).wait(), I.where(c, c.next));
          I.stats.bytes_written += c.length;
          ++ci;
          filled = 0;
        }
      }
    });
    STRATA_CHECK(ci == I.first_chunk[tensor + 1], Errc::invalid_argument,
                 "parameter store: write_from: ", I.tensors[tensor].name, " is larger than its source");
  } catch (...) {
    I.drop_writes(tensor);
    I.stats.write_seconds += since(t0);
    throw;
  }
  I.written[tensor] = 1;
  I.stats.write_seconds += since(t0);
}

void ParamStore::commit_now(std::size_t tensor, bool all) {
  auto& I = *impl_;
  std::lock_guard<std::mutex> lock(I.mutex);
  STRATA_CHECK(all || tensor < I.tensors.size(), Errc::internal, "parameter store: commit of tensor ", tensor, " of ",
               I.tensors.size());
  for (std::size_t t = all ? 0 : tensor; t < (all ? I.tensors.size() : tensor + 1); ++t) {
    if (!I.written[t]) continue;
    for (std::size_t ci = I.first_chunk[t]; ci < I.first_chunk[t + 1]; ++ci)
      if (I.chunks[ci].has_next) I.files.commit(ci);
    if (I.stale[t]) --I.stale_tensors;
    I.written[t] = I.early[t] = I.stale[t] = 0;
  }
}

std::uint64_t ParamStore::buffer_bytes() const noexcept { return impl_->chunk_bytes; }
int ParamStore::buffer_count() const noexcept { return static_cast<int>(impl_->buffers.size()); }
std::uint64_t ParamStore::file_bytes() const noexcept { return impl_->files.file_bytes; }
std::size_t ParamStore::chunks() const noexcept { return impl_->chunks.size(); }

ParamStoreStats ParamStore::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->stats;
}

std::string ParamStore::file_of(std::size_t tensor, std::uint64_t offset) const {
  const auto& I = *impl_;
  std::lock_guard<std::mutex> lock(I.mutex);
  for (std::size_t ci = I.first_chunk.at(tensor); ci < I.first_chunk.at(tensor + 1); ++ci) {
    const auto& c = I.chunks[ci];
    if (offset >= c.offset && offset < c.offset + c.length) return I.files.path(c.slot);
  }
  return {};
}

// Queued requests: data handed to the store's worker, run there with the blocking bodies.

namespace {
IoWorker& worker_of(const std::unique_ptr<IoWorker>& w) {
  STRATA_CHECK(w != nullptr, Errc::internal, "parameter store: queued requests need options.device");
  return *w;
}
}  // namespace

void ParamStore::settle() const noexcept {
  if (impl_->worker) impl_->worker->wait(impl_->worker->last());
}

ParamStore::Ticket ParamStore::read_async(std::size_t tensor, std::vector<Piece> into) {
  auto& I = *impl_;
  STRATA_CHECK(tensor < I.tensors.size(), Errc::invalid_argument, "parameter store: no tensor ", tensor);
  std::uint64_t total = 0;
  for (const auto& p : into) total += p.bytes;
  STRATA_CHECK(total == I.tensors[tensor].bytes, Errc::internal, "parameter store: read of ", I.tensors[tensor].name,
               " into ", total, " B of pieces, but it holds ", I.tensors[tensor].bytes, " B");
  // A stale tensor is refused here, on the caller's thread, rather than as the worker's
  // sticky failure, which would also refuse the load that repairs it. Requests queued before
  // this one may still rewrite it: those finish first. (Stale tensors are rare: the check
  // takes neither the lock, which a write holds, nor a wait while there are none.)
  if (I.stale_tensors.load() > 0 && stale(tensor))
    read_now(tensor, [](std::uint64_t, const void*, std::uint64_t) {});  // throws, naming why
  return worker_of(I.worker).submit([this, tensor, into = std::move(into)] {
    Tracer::Span span(impl_->options.tracer, "nvme read", str_cat("params ", impl_->tensors[tensor].name));
    std::size_t k = 0;
    std::uint64_t piece_begin = 0;  // tensor offset of into[k]
    read_now(tensor, [&](std::uint64_t off, const void* data, std::uint64_t n) {
      const char* src = static_cast<const char*>(data);
      while (n > 0) {
        while (off >= piece_begin + into[k].bytes) piece_begin += into[k++].bytes;
        const std::uint64_t take = std::min(n, piece_begin + into[k].bytes - off);
        std::memcpy(static_cast<char*>(into[k].dst) + (off - piece_begin), src, take);
        src += take;
        off += take;
        n -= take;
      }
    });
  });
}

ParamStore::Ticket ParamStore::write_async(std::size_t tensor, const void* src, MemoryLedger* retire_to) {
  auto& I = *impl_;
  STRATA_CHECK(tensor < I.tensors.size(), Errc::invalid_argument, "parameter store: no tensor ", tensor);
  std::function<void()> release;
  if (retire_to != nullptr) release = [retire_to, src] { retire_to->retire(const_cast<void*>(src)); };
  return worker_of(I.worker).submit(
      [this, tensor, src] {
        Tracer::Span span(impl_->options.tracer, "nvme write", str_cat("params ", impl_->tensors[tensor].name));
        write_now(tensor, src);
      },
      std::move(release));
}

ParamStore::Ticket ParamStore::commit_async() {
  return worker_of(impl_->worker).submit([this] { commit_now(0, true); });
}

ParamStore::Ticket ParamStore::commit_async(std::size_t tensor) {
  STRATA_CHECK(tensor < impl_->tensors.size(), Errc::invalid_argument, "parameter store: no tensor ", tensor);
  return worker_of(impl_->worker).submit([this, tensor] { commit_now(tensor, false); });
}

void ParamStore::wait_on(device::Stream& stream, Ticket t) { worker_of(impl_->worker).wait_on(stream, t); }
void ParamStore::wait(Ticket t) { worker_of(impl_->worker).wait(t); }
bool ParamStore::succeeded(Ticket t) const { return worker_of(impl_->worker).succeeded(t); }

void ParamStore::synchronize() {
  if (impl_->worker) impl_->worker->synchronize();
}

}  // namespace strata::offload
