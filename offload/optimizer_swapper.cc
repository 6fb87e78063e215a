// OptimizerSwapper (see optimizer_swapper.h): sub-group layout, the committed and spare swap
// files, the buffer budget, and the reads and writes outside a step (swapper_step.cc).
#include "offload/optimizer_swapper.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <tuple>

#include "io/aligned.h"
#include "io/buffer_pool.h"
#include "io/engine.h"
#include "io/swap_file.h"
#include "offload/detail/swapper_impl.h"
#include "offload/io_error.h"
#include "runtime/core/dtype.h"
#include "runtime/core/error.h"
#include "runtime/core/trace.h"
#include "runtime/core/units.h"

namespace strata::offload {
namespace {

std::uint64_t buffer_elems_for(const SwapperOptions& o, const std::vector<SwapTensor>& tensors) {
  std::uint64_t largest = 1;
  for (const auto& t : tensors) largest = std::max(largest, t.elems);
  const std::uint64_t elems = std::max<std::uint64_t>(1, std::min(o.sub_group_elems, largest));
  const std::uint64_t align = moment_align(o.moment_format);  // q8: whole blocks
  return std::max(align, elems / align * align);
}

detail::SwapLayout layout_for(const SwapperOptions& o, std::uint64_t buffer_elems) {
  const std::uint64_t group = moment_align(o.moment_format);
  return {.chunk_units = buffer_elems,
          .unit_bytes = payload_of(o, group),
          .group_units = group,
          .element_bytes = group == 1 ? 4u : 1u,  // q8 payloads are whole blocks of bytes
          .block_bytes = o.block_bytes,
          .spares = o.spare_sub_groups};
}

std::vector<std::uint64_t> sizes_of(const std::vector<SwapTensor>& tensors) {
  std::vector<std::uint64_t> v;
  for (const auto& t : tensors) v.push_back(t.elems);
  return v;
}

}  // namespace

std::uint64_t OptimizerSwapper::min_budget_bytes(const SwapperOptions& o, const std::vector<SwapTensor>& tensors) {
  return io::align_up(payload_of(o, buffer_elems_for(o, tensors)));
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
               moment_format_name(o.moment_format), " exp_avg and exp_avg_sq), but the budget leaves ",
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
  STRATA_CHECK(!I.stepping, Errc::internal,
               "optimizer swapper: write_state() while a step is open (finish or drop it first)");
  STRATA_CHECK(tensor < I.tensors.size(), Errc::invalid_argument, "optimizer swapper: no tensor ", tensor);
  STRATA_CHECK(!I.pending, Errc::internal,
               "optimizer swapper: write_state() while a deferred step waits for its commit");
  // Into spare files, never the committed ones: those may be the ones a checkpoint hard-linked
  // (its bytes must not change), and until commit_written() they stay the last good state if a
  // write fails (unless the spares ran out and the load committed sub-groups as it went).
  const io::PoolBuffer& b = I.buffers[0];
  I.written.resize(I.tensors.size(), 0);
  I.written[tensor] = 0;  // a failed write leaves the tensor unwritten
  std::size_t ci = I.first_chunk[tensor];
  try {
    for (; ci < I.first_chunk[tensor + 1]; ++ci) {
      Chunk& c = I.chunks[ci];
      if (!c.has_next) {  // a tensor written again: its earlier write is replaced
        STRATA_CHECK(I.lend(ci, true), Errc::internal, "optimizer swapper: no spare file for ", I.where(c));
        I.uncommitted.push_back(ci);
      }
      I.unshare(c.next);
      const SubGroup g = I.view(c, b);
      std::memcpy(g.master, master + c.offset, c.length * 4);
      const MomentFormat f = I.options.moment_format;
      for (auto [dst, src, which] :
           {std::tuple{g.exp_avg, exp_avg, Moment::first}, std::tuple{g.exp_avg_sq, exp_avg_sq, Moment::second}}) {
        if (src != nullptr)
          moments_from_fp32(src + c.offset, dst, f, which, c.length);
        else
          std::memset(dst, 0, moment_bytes(f, c.length));  // zero codes: zero moments in every format
      }
      std::memset(b.data() + I.payload(c), 0, b.bytes() - I.payload(c));
      STRATA_IO_CHECK(I.files.file(c.next).swap_out(b.data(), b.bytes()).wait(), I.where(c));
    }
  } catch (const std::exception& e) {
    // This tensor's writes are dropped (one may not have landed), so no later write commits
    // them early.
    for (std::size_t k = I.first_chunk[tensor]; k < I.first_chunk[tensor + 1]; ++k) {
      const auto at = std::find(I.uncommitted.begin(), I.uncommitted.end(), k);
      if (at == I.uncommitted.end()) continue;
      I.uncommitted.erase(at);
      I.files.discard(k);
    }
    if (I.early > 0) I.tear(I.early, str_cat("a load failed (", e.what(), ")"));
    throw;
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
  I.settle_uncommitted(true);
  I.early = 0;
  I.torn.clear();  // every sub-group holds the loaded state
  I.written.assign(I.tensors.size(), 0);
}

void OptimizerSwapper::discard_written() noexcept {
  auto& I = *impl_;
  if (I.pending || I.stepping) {  // write_state() was refused: the spares lent are the step's
    I.written.assign(I.tensors.size(), 0);
    return;
  }
  I.settle_uncommitted(false);
  if (I.early > 0 && I.torn.empty()) I.tear(I.early, "a load was dropped");
  I.early = 0;
  I.written.assign(I.tensors.size(), 0);
}

bool OptimizerSwapper::has_written() const noexcept {
  for (char w : impl_->written)
    if (w != 0) return true;
  return false;
}

void OptimizerSwapper::read_state(std::size_t tensor, std::uint64_t offset, std::uint64_t elems, float* master,
                                  float* exp_avg, float* exp_avg_sq) {
  auto& I = *impl_;
  STRATA_CHECK(!I.stepping, Errc::internal,
               "optimizer swapper: read_state() while a step is open (finish or drop it first)");
  STRATA_CHECK(tensor < I.tensors.size() && offset + elems <= I.tensors[tensor].elems, Errc::invalid_argument,
               "optimizer swapper: read_state outside tensor ", tensor);
  I.check_whole();
  const io::PoolBuffer& b = I.buffers[0];
  for (std::size_t ci = I.first_chunk[tensor]; ci < I.first_chunk[tensor + 1]; ++ci) {
    Chunk& c = I.chunks[ci];
    const std::uint64_t lo = std::max(offset, c.offset), hi = std::min(offset + elems, c.offset + c.length);
    if (lo >= hi) continue;
    STRATA_IO_CHECK(I.files.file(c.slot).swap_in(b.data(), b.bytes()).wait(), I.where(c));
    const SubGroup g = I.view(c, b);
    if (master != nullptr) std::memcpy(master + (lo - offset), g.master + (lo - c.offset), (hi - lo) * 4);
    for (auto [dst, src, which] :
         {std::tuple{exp_avg, g.exp_avg, Moment::first}, std::tuple{exp_avg_sq, g.exp_avg_sq, Moment::second}}) {
      if (dst != nullptr)
        moments_range_to_fp32(src, I.options.moment_format, which, lo - c.offset, hi - lo, dst + (lo - offset));
    }
  }
}

void OptimizerSwapper::visit_masters(
    std::size_t tensor, const std::function<void(std::uint64_t offset, const float* master, std::uint64_t elems)>& fn) {
  auto& I = *impl_;
  STRATA_CHECK(!I.stepping, Errc::internal,
               "optimizer swapper: visit_masters() while a step is open (finish or drop it first)");
  STRATA_CHECK(tensor < I.tensors.size(), Errc::invalid_argument, "optimizer swapper: no tensor ", tensor);
  I.check_whole();
  const io::PoolBuffer& b = I.buffers[0];
  for (std::size_t ci = I.first_chunk[tensor]; ci < I.first_chunk[tensor + 1]; ++ci) {
    Chunk& c = I.chunks[ci];
    STRATA_IO_CHECK(I.files.file(c.slot).swap_in(b.data(), b.bytes()).wait(), I.where(c));
    fn(c.offset, I.view(c, b).master, c.length);
  }
}

bool OptimizerSwapper::pending() const noexcept { return impl_->pending; }

void OptimizerSwapper::commit_pending() {
  auto& I = *impl_;
  STRATA_CHECK(I.pending, Errc::internal, "optimizer swapper: commit_pending() without a deferred step");
  I.settle_uncommitted(true);
  I.early = 0;
  I.pending = false;
}

void OptimizerSwapper::discard_pending() noexcept {
  auto& I = *impl_;
  if (!I.pending) return;
  I.settle_uncommitted(false);
  if (I.early > 0 && I.torn.empty()) I.tear(I.early, "a step that had begun to commit was undone");
  I.early = 0;
  I.pending = false;
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
  for (const auto& t : impl_->tensors) n += payload_of(impl_->options, t.elems);
  return n;
}

std::uint64_t OptimizerSwapper::file_bytes() const noexcept { return impl_->files.file_bytes; }

std::vector<OptimizerSwapper::SealedFile> OptimizerSwapper::sealed_files(std::size_t tensor) const {
  const auto& I = *impl_;
  I.check_whole();
  std::vector<SealedFile> out;
  for (std::size_t ci = I.first_chunk.at(tensor); ci < I.first_chunk.at(tensor + 1); ++ci) {
    const Chunk& c = I.chunks[ci];
    out.push_back({I.files.path(c.slot), c.offset, c.length});
  }
  return out;
}

std::vector<std::string> OptimizerSwapper::all_files() const { return impl_->files.all_paths(); }

std::string OptimizerSwapper::file_of(std::size_t tensor, std::uint64_t elem) const {
  const auto& I = *impl_;
  for (std::size_t ci = I.first_chunk.at(tensor); ci < I.first_chunk.at(tensor + 1); ++ci) {
    const Chunk& c = I.chunks[ci];
    if (elem >= c.offset && elem < c.offset + c.length) return I.files.path(c.slot);
  }
  return {};
}

}  // namespace strata::offload
