// OptimizerSwapper (see optimizer_swapper.h): sub-group layout, the two swap-file
// generations, the buffer budget and the read/compute/write pipeline of step().
#include "offload/optimizer_swapper.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>

#include "io/aligned.h"
#include "io/buffer_pool.h"
#include "io/engine.h"
#include "io/swap_file.h"
#include "offload/detail/swap_files.h"
#include "offload/io_error.h"
#include "runtime/core/dtype.h"
#include "runtime/core/error.h"
#include "runtime/core/trace.h"
#include "runtime/core/units.h"

namespace strata::offload {
namespace {

using Clock = std::chrono::steady_clock;
// Bytes per element of a sub-group's state: the fp32 master, exp_avg and exp_avg_sq.
std::uint64_t unit_bytes(const SwapperOptions& o) { return 4 + 2 * dtype_size(o.moment_dtype); }

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::uint64_t buffer_elems_for(const SwapperOptions& o, const std::vector<SwapTensor>& tensors) {
  std::uint64_t largest = 1;
  for (const auto& t : tensors) largest = std::max(largest, t.elems);
  return std::max<std::uint64_t>(1, std::min(o.sub_group_elems, largest));
}

// A sub-group's swap files; its length counts elements.
using Chunk = detail::SwapChunk;
detail::SwapLayout layout_for(const SwapperOptions& o, std::uint64_t buffer_elems) {
  return {.chunk_units = buffer_elems, .unit_bytes = unit_bytes(o), .element_bytes = 4, .block_bytes = o.block_bytes};
}

std::vector<std::uint64_t> sizes_of(const std::vector<SwapTensor>& tensors) {
  std::vector<std::uint64_t> v;
  for (const auto& t : tensors) v.push_back(t.elems);
  return v;
}

}  // namespace

struct OptimizerSwapper::Impl {
  SwapperOptions options;
  std::vector<SwapTensor> tensors;
  std::uint64_t buffer_elems = 0, buffer_bytes = 0;
  detail::SwapIo sio;        // engine and buffers: declared before the files, so destroyed after them
  detail::SwapChunks files;  // the sub-groups' swap files
  std::vector<io::PoolBuffer>& buffers = sio.buffers;
  std::vector<Chunk>& chunks = files.chunks;
  std::vector<std::size_t>& first_chunk = files.first;  // per tensor, plus the end
  int current = 0;                                      // the generation holding the last good state
  bool pending = false;                                 // a deferred step's generation waits for commit or discard
  std::vector<char> written;                            // per tensor: write_state() since the last commit_written()
  SwapperStats stats;

  std::string where(const Chunk& c) const {
    return str_cat("optimizer state of ", tensors[c.tensor].name, " (sub-group ", c.index, ", elements [", c.offset,
                   ", ", c.offset + c.length, ") of its shard: master, exp_avg, exp_avg_sq) on the NVMe tier");
  }
  // A generation file that a checkpoint has hard-linked gets a new inode under its path
  // before it is written, so the checkpoint keeps its bytes (its blocks stay reserved). The
  // new file is made and reserved under a temporary name and renamed over the path, so a
  // failure (a full filesystem) leaves the old file in place and the swapper usable.
  void unshare(Chunk& c, int gen) {
    struct stat st {};
    if (::stat(c.path[gen].c_str(), &st) != 0 || st.st_nlink <= 1) return;
    const auto spec = c.file[gen]->layout().spec;
    const std::string tmp = c.path[gen].substr(0, c.path[gen].size() - 5) + ".new.swap";  // ".a.swap" -> ".a.new.swap"
    try {
      {
        auto f = io::SwapFile::create(*sio.engine, tmp, spec);
        STRATA_IO_CHECK(f.status(), where(c) + ", replacing a generation a checkpoint links");
        detail::reserve_blocks(tmp, f->layout().file_bytes, "NVMe tier");
      }
      STRATA_CHECK(::rename(tmp.c_str(), c.path[gen].c_str()) == 0, Errc::io, "optimizer swapper: cannot rename '", tmp,
                   "' over '", c.path[gen], "' (linked by a checkpoint): ", errno_text(errno));
      auto f = io::SwapFile::open(*sio.engine, c.path[gen]);
      STRATA_IO_CHECK(f.status(), where(c) + ", reopening a replaced generation");
      c.file[gen] = std::make_unique<io::SwapFile>(std::move(*f));
    } catch (const Error& e) {
      ::unlink(tmp.c_str());
      // The checkpoint keeps the old blocks, so the rewrite needs new ones on this filesystem.
      throw Error(e.code(),
                  str_cat(e.what(),
                          " (a checkpoint hard-linked this file, so rewriting it needs new space on the "
                          "filesystem of offload_optimizer.nvme_path: free space there, keep fewer "
                          "checkpoints (--keep), or save checkpoints on another filesystem)"),
                  e.where(), e.sys_errno());
    }
  }
  std::uint64_t payload(const Chunk& c) const { return c.length * unit_bytes(options); }
  // [master | exp_avg | exp_avg_sq] of the sub-group's elements, the moments in moment_dtype.
  SubGroup view(const Chunk& c, const io::PoolBuffer& b) const {
    std::byte* base = b.data();
    const std::uint64_t es = dtype_size(options.moment_dtype);
    return {
        c.tensor, c.offset, c.length, reinterpret_cast<float*>(base), base + 4 * c.length, base + (4 + es) * c.length};
  }
};

std::uint64_t OptimizerSwapper::min_budget_bytes(const SwapperOptions& o, const std::vector<SwapTensor>& tensors) {
  return io::align_up(buffer_elems_for(o, tensors) * unit_bytes(o));
}

OptimizerSwapper::Footprint OptimizerSwapper::footprint(const SwapperOptions& o,
                                                        const std::vector<SwapTensor>& tensors) {
  STRATA_CHECK(o.buffer_count >= 1, Errc::invalid_argument, "offload_optimizer.buffer_count = ", o.buffer_count,
               ": use at least 1 (4 lets reads, the optimizer and writes overlap)");
  Footprint f;
  const std::uint64_t elems = buffer_elems_for(o, tensors);
  f.buffer_bytes = min_budget_bytes(o, tensors);
  STRATA_CHECK(o.budget_bytes >= f.buffer_bytes, Errc::out_of_budget,
               "host tier: the NVMe optimizer swapper needs at least ", format_bytes(f.buffer_bytes), " (",
               f.buffer_bytes, " B) of pinned host memory for one swap buffer of ", elems, " elements (fp32 master, ",
               dtype_name(o.moment_dtype), " exp_avg and exp_avg_sq), but the budget leaves ",
               format_bytes(o.budget_bytes), " (", o.budget_bytes,
               " B): raise memory_budget.host (or the pinned budget) or lower zero_optimization.sub_group_size");
  f.buffer_count = static_cast<int>(std::min<std::uint64_t>(o.buffer_count, o.budget_bytes / f.buffer_bytes));
  detail::count_swap_files(f, sizes_of(tensors), layout_for(o, elems));
  return f;
}

OptimizerSwapper::OptimizerSwapper(const SwapperOptions& options, std::vector<SwapTensor> tensors)
    : impl_(std::make_unique<Impl>()) {
  auto& I = *impl_;
  I.options = options;
  I.tensors = std::move(tensors);
  STRATA_CHECK(!options.dir.empty(), Errc::invalid_argument, "optimizer swapper: offload_optimizer.nvme_path is empty");
  const Footprint f = footprint(options, I.tensors);  // refuses a buffer count or budget that cannot work
  I.buffer_elems = buffer_elems_for(options, I.tensors);
  I.buffer_bytes = f.buffer_bytes;
  const int count = f.buffer_count;

  detail::start_swap_io(I.sio, options.queue_depth, options.submit_batch, options.block_bytes, I.buffer_bytes, count,
                        options.lock_memory, "optimizer swapper", "swap buffers", f.file_count,
                        "zero_optimization.sub_group_size");

  std::vector<std::string> names;
  for (const auto& t : I.tensors) names.push_back(t.name);
  I.files.create(
      *I.sio.engine, options.dir, "offload_optimizer.nvme_path", names, sizes_of(I.tensors),
      layout_for(options, I.buffer_elems), ".sg", [&I](const Chunk& c, int) { return I.where(c); }, "NVMe tier");
}

OptimizerSwapper::~OptimizerSwapper() = default;

void OptimizerSwapper::write_state(std::size_t tensor, const float* master, const float* exp_avg,
                                   const float* exp_avg_sq) {
  auto& I = *impl_;
  STRATA_CHECK(tensor < I.tensors.size(), Errc::invalid_argument, "optimizer swapper: no tensor ", tensor);
  STRATA_CHECK(!I.pending, Errc::internal,
               "optimizer swapper: write_state() while a deferred step waits for its commit");
  // Into the other generation, never the current one: the current files may be the ones a
  // checkpoint hard-linked (its bytes must not change), and until commit_written() the
  // current generation stays the last good state if a write fails.
  const int wr = 1 - I.current;
  const io::PoolBuffer& b = I.buffers[0];
  I.written.resize(I.tensors.size(), 0);
  I.written[tensor] = 0;  // a failed write leaves the tensor unwritten
  for (std::size_t ci = I.first_chunk[tensor]; ci < I.first_chunk[tensor + 1]; ++ci) {
    Chunk& c = I.chunks[ci];
    I.unshare(c, wr);
    const SubGroup g = I.view(c, b);
    std::memcpy(g.master, master + c.offset, c.length * 4);
    for (auto [dst, src] : {std::pair{g.exp_avg, exp_avg}, std::pair{g.exp_avg_sq, exp_avg_sq}}) {
      if (src != nullptr)
        convert(src + c.offset, DType::fp32, dst, I.options.moment_dtype, c.length);
      else
        std::memset(dst, 0, c.length * dtype_size(I.options.moment_dtype));
    }
    std::memset(b.data() + I.payload(c), 0, b.bytes() - I.payload(c));
    STRATA_IO_CHECK(c.file[wr]->swap_out(b.data(), b.bytes()).wait(), I.where(c));
  }
  I.written[tensor] = 1;
}

void OptimizerSwapper::commit_written() {
  auto& I = *impl_;
  I.written.resize(I.tensors.size(), 0);
  for (std::size_t t = 0; t < I.tensors.size(); ++t) {
    STRATA_CHECK(I.written[t] != 0, Errc::internal, "optimizer swapper: commit_written() before ", I.tensors[t].name,
                 "'s state was written (write_state() every tensor first)");
  }
  I.current = 1 - I.current;
  I.written.assign(I.tensors.size(), 0);
}

void OptimizerSwapper::discard_written() noexcept { impl_->written.assign(impl_->tensors.size(), 0); }

bool OptimizerSwapper::has_written() const noexcept {
  for (char w : impl_->written)
    if (w != 0) return true;
  return false;
}

void OptimizerSwapper::read_state(std::size_t tensor, std::uint64_t offset, std::uint64_t elems, float* master,
                                  float* exp_avg, float* exp_avg_sq) {
  auto& I = *impl_;
  STRATA_CHECK(tensor < I.tensors.size() && offset + elems <= I.tensors[tensor].elems, Errc::invalid_argument,
               "optimizer swapper: read_state outside tensor ", tensor);
  const io::PoolBuffer& b = I.buffers[0];
  for (std::size_t ci = I.first_chunk[tensor]; ci < I.first_chunk[tensor + 1]; ++ci) {
    Chunk& c = I.chunks[ci];
    const std::uint64_t lo = std::max(offset, c.offset), hi = std::min(offset + elems, c.offset + c.length);
    if (lo >= hi) continue;
    STRATA_IO_CHECK(c.file[I.current]->swap_in(b.data(), b.bytes()).wait(), I.where(c));
    const SubGroup g = I.view(c, b);
    if (master != nullptr) std::memcpy(master + (lo - offset), g.master + (lo - c.offset), (hi - lo) * 4);
    const std::uint64_t es = dtype_size(I.options.moment_dtype);
    for (auto [dst, src] : {std::pair{exp_avg, g.exp_avg}, std::pair{exp_avg_sq, g.exp_avg_sq}}) {
      if (dst != nullptr)
        convert(static_cast<const std::byte*>(src) + (lo - c.offset) * es, I.options.moment_dtype, dst + (lo - offset),
                DType::fp32, hi - lo);
    }
  }
}

void OptimizerSwapper::visit_masters(
    std::size_t tensor, const std::function<void(std::uint64_t offset, const float* master, std::uint64_t elems)>& fn) {
  auto& I = *impl_;
  STRATA_CHECK(tensor < I.tensors.size(), Errc::invalid_argument, "optimizer swapper: no tensor ", tensor);
  const io::PoolBuffer& b = I.buffers[0];
  for (std::size_t ci = I.first_chunk[tensor]; ci < I.first_chunk[tensor + 1]; ++ci) {
    Chunk& c = I.chunks[ci];
    STRATA_IO_CHECK(c.file[I.current]->swap_in(b.data(), b.bytes()).wait(), I.where(c));
    fn(c.offset, I.view(c, b).master, c.length);
  }
}

void OptimizerSwapper::step(const std::function<void(const SubGroup&)>& fn) { step(fn, StepOrder{}); }

bool OptimizerSwapper::pending() const noexcept { return impl_->pending; }

void OptimizerSwapper::commit_pending() {
  auto& I = *impl_;
  STRATA_CHECK(I.pending, Errc::internal, "optimizer swapper: commit_pending() without a deferred step");
  I.current = 1 - I.current;
  I.pending = false;
}

void OptimizerSwapper::discard_pending() noexcept { impl_->pending = false; }

void OptimizerSwapper::step(const std::function<void(const SubGroup&)>& fn, const StepOrder& order) {
  auto& I = *impl_;
  STRATA_CHECK(!I.pending, Errc::internal, "optimizer swapper: step() while a deferred step waits for its commit");
  STRATA_CHECK(!has_written(), Errc::internal,
               "optimizer swapper: step() after write_state() without commit_written() or discard_written()");
  const int rd = I.current, wr = 1 - I.current;
  for (auto& c : I.chunks) I.unshare(c, wr);
  // The chunks in visiting order: each listed tensor's sub-groups in offset order.
  std::vector<std::size_t> seq;
  seq.reserve(I.chunks.size());
  if (order.tensors.empty()) {
    for (std::size_t ci = 0; ci < I.chunks.size(); ++ci) seq.push_back(ci);
  } else {
    std::vector<char> seen(I.tensors.size(), 0);
    for (std::size_t t : order.tensors) {
      STRATA_CHECK(t < I.tensors.size() && !seen[t], Errc::internal, "optimizer swapper: tensor ", t,
                   " missing or listed twice in the step order");
      seen[t] = 1;
      for (std::size_t ci = I.first_chunk[t]; ci < I.first_chunk[t + 1]; ++ci) seq.push_back(ci);
    }
    STRATA_CHECK(seq.size() == I.chunks.size(), Errc::internal, "optimizer swapper: the step order leaves tensors out");
  }
  struct Pending {
    std::size_t chunk;
    int buffer;
    io::SwapOp op;
    Clock::time_point issued = Clock::now();
  };
  Tracer* tracer = I.options.tracer;
  auto trace = [tracer](const char* lane, const std::string& name, Clock::time_point t0) {
    if (tracer != nullptr && tracer->enabled()) tracer->record(lane, name, t0, Clock::now());
  };
  std::deque<Pending> reads, writes;
  std::vector<int> free_buffers;
  for (int i = static_cast<int>(I.buffers.size()); i-- > 0;) free_buffers.push_back(i);
  std::size_t next_read = 0;
  // At most half the buffers read ahead, the rest drain writes: the engine round-robins its
  // queue depth over requests, so this keeps reads and writes about equally in flight (as
  // bench io's mixed run does); with every free buffer reading, the reads of 3-4 sub-groups
  // finished together and the first one, which the optimizer waits for, finished last.
  const std::size_t max_reads = std::max<std::size_t>(1, I.buffers.size() / 2);
  SwapperStats st;
  const auto t0 = Clock::now();
  // Reads run ahead into free buffers; a buffer comes back when its write completes.
  auto pump = [&] {
    while (next_read < seq.size() && !free_buffers.empty() && reads.size() < max_reads) {
      const int b = free_buffers.back();
      free_buffers.pop_back();
      const std::size_t ci = seq[next_read++];
      Chunk& c = I.chunks[ci];
      reads.push_back({ci, b, c.file[rd]->swap_in(I.buffers[b].data(), I.buffers[b].bytes())});
      st.bytes_read += I.payload(c);  // counted when issued: a failed step's reads moved bytes too
    }
  };
  auto finish_write = [&] {
    Pending w = std::move(writes.front());
    writes.pop_front();
    const auto tw = Clock::now();
    const io::Status s = w.op.wait();
    st.wait_seconds += since(tw);
    trace("nvme write", str_cat("write ", I.tensors[I.chunks[w.chunk].tensor].name, " sg", I.chunks[w.chunk].index),
          w.issued);
    free_buffers.push_back(w.buffer);
    STRATA_IO_CHECK(s, I.where(I.chunks[w.chunk]) + ", writing generation " + (wr == 0 ? "a" : "b"));
  };
  // The tail's order: chunk ids run in tensor then offset order, so sorting the chunks of the
  // tensors not begun yet visits them lowest tensor first, each in offset order.
  bool ascending = false;
  auto reorder = [&] {
    if (ascending || order.ascending_rest == nullptr || !order.ascending_rest->load(std::memory_order_acquire)) return;
    ascending = true;
    std::size_t b = next_read;
    while (b < seq.size() && I.chunks[seq[b]].index != 0) ++b;
    std::sort(seq.begin() + static_cast<std::ptrdiff_t>(b), seq.end());
  };
  try {
    for (std::size_t i = 0; i < seq.size(); ++i) {
      reorder();
      while (!writes.empty() && writes.front().op.ready()) finish_write();
      pump();
      while (reads.empty()) {  // every buffer is draining: wait for the oldest write
        finish_write();
        pump();
      }
      Pending r = std::move(reads.front());
      reads.pop_front();
      Chunk& c = I.chunks[r.chunk];
      if (order.ready && c.index == 0) {
        try {
          order.ready(c.tensor);  // the reads of this tensor and the next run ahead meanwhile
        } catch (...) {
          reads.push_front(std::move(r));  // drained below with the rest
          throw;
        }
      }
      const auto tw = Clock::now();
      const io::Status s = r.op.wait();
      st.wait_seconds += since(tw);
      trace("nvme read", str_cat("read ", I.tensors[c.tensor].name, " sg", c.index), r.issued);
      if (!s.ok()) {
        free_buffers.push_back(r.buffer);
        STRATA_IO_CHECK(s, I.where(c));
      }
      const auto tc = Clock::now();
      try {
        fn(I.view(c, I.buffers[r.buffer]));
      } catch (...) {
        free_buffers.push_back(r.buffer);
        throw;
      }
      st.compute_seconds += since(tc);
      trace("optimizer", str_cat("adam ", I.tensors[c.tensor].name, " sg", c.index), tc);
      writes.push_back(
          {r.chunk, r.buffer, c.file[wr]->swap_out(I.buffers[r.buffer].data(), I.buffers[r.buffer].bytes())});
      st.bytes_written += I.payload(c);
      if (order.done && r.chunk + 1 == I.first_chunk[c.tensor + 1]) order.done(c.tensor);
      pump();
    }
    while (!writes.empty()) finish_write();
  } catch (...) {
    // Nothing may still be reading or writing a buffer when the error leaves: drain.
    for (auto& p : reads) (void)p.op.wait();
    for (auto& p : writes) (void)p.op.wait();
    st.step_seconds = since(t0);
    I.stats = st;  // what the failed step moved
    throw;
  }
  if (order.defer_commit)
    I.pending = true;  // on disk, current once the caller commits
  else
    I.current = wr;  // every sub-group of the new state is on disk
  st.step_seconds = since(t0);
  I.stats = st;
}

std::uint64_t OptimizerSwapper::buffer_bytes() const noexcept { return impl_->buffer_bytes; }
int OptimizerSwapper::buffer_count() const noexcept { return static_cast<int>(impl_->buffers.size()); }
std::uint64_t OptimizerSwapper::buffer_elems() const noexcept { return impl_->buffer_elems; }
std::size_t OptimizerSwapper::sub_groups() const noexcept { return impl_->chunks.size(); }
std::size_t OptimizerSwapper::tensors() const noexcept { return impl_->tensors.size(); }
const std::string& OptimizerSwapper::dir() const noexcept { return impl_->options.dir; }
SwapperStats OptimizerSwapper::stats() const noexcept { return impl_->stats; }

std::uint64_t OptimizerSwapper::state_bytes() const noexcept {
  std::uint64_t n = 0;
  for (const auto& t : impl_->tensors) n += t.elems * unit_bytes(impl_->options);
  return n;
}

std::uint64_t OptimizerSwapper::file_bytes() const noexcept { return impl_->files.file_bytes; }

std::vector<OptimizerSwapper::SealedFile> OptimizerSwapper::sealed_files(std::size_t tensor) const {
  const auto& I = *impl_;
  std::vector<SealedFile> out;
  for (std::size_t ci = I.first_chunk.at(tensor); ci < I.first_chunk.at(tensor + 1); ++ci) {
    const Chunk& c = I.chunks[ci];
    out.push_back({c.path[I.current], c.offset, c.length});
  }
  return out;
}

std::vector<std::string> OptimizerSwapper::all_files() const {
  std::vector<std::string> out;
  for (const Chunk& c : impl_->chunks) out.insert(out.end(), {c.path[0], c.path[1]});
  return out;
}

std::string OptimizerSwapper::file_of(std::size_t tensor, std::uint64_t elem) const {
  const auto& I = *impl_;
  for (std::size_t ci = I.first_chunk.at(tensor); ci < I.first_chunk.at(tensor + 1); ++ci) {
    const Chunk& c = I.chunks[ci];
    if (elem >= c.offset && elem < c.offset + c.length) return c.path[I.current];
  }
  return {};
}

}  // namespace strata::offload
