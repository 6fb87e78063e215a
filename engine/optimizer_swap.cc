// OptimizerState's layers on NVMe (the protocol in optimizer_state.h): the swapper it owns,
// opened under the locked rank directory and charged to the ledger, and the state it holds.
#include "engine/optimizer_state.h"

#include "runtime/core/error.h"
#include "runtime/core/units.h"

namespace strata::engine {

offload::SwapperOptions OptimizerState::swapper_options(const EngineConfig& cfg, std::uint64_t host_room) {
  const OffloadConfig& oc = cfg.offload_optimizer;
  STRATA_CHECK(!oc.nvme_path.empty(), Errc::invalid_argument,
               "optimizer state is placed on NVMe but offload_optimizer.nvme_path is not set: give a directory on the "
               "NVMe drive");
  offload::SwapperOptions so;
  so.sub_group_elems = cfg.zero.sub_group_size;
  so.buffer_count = oc.buffer_count > 0 ? oc.buffer_count : 4;
  so.budget_bytes = host_room;
  so.moment_format = cfg.optimizer.moment_format;
  so.spare_sub_groups = oc.spare_sub_groups;
  NvmeHomes::apply_aio(cfg, so);
  return so;
}

std::vector<offload::SwapTensor> OptimizerState::swap_tensors(const Layout& layout, const ShardMap& shards) {
  std::vector<offload::SwapTensor> tensors;
  for (std::size_t li = 0; li < shards.size(); ++li) {
    if (shards.opt_tier(static_cast<int>(li)) == Tier::nvme)
      tensors.push_back({str_cat("layer ", layout.layers()[li].id), layout.layer_shard(static_cast<int>(li))});
  }
  return tensors;
}

void OptimizerState::open_swapper(std::uint64_t host_reserve) {
  const std::uint64_t available = c_.ledger.available(Tier::host);
  offload::SwapperOptions so = swapper_options(c_.cfg, available > host_reserve ? available - host_reserve : 0);
  so.dir = c_.nvme.lock_rank_dir(c_.cfg.offload_optimizer.nvme_path, "offload_optimizer.nvme_path");
  so.tracer = c_.tracer;
  c_.nvme.warn_aio_knobs();
  swap_index_.assign(c_.shards.size(), -1);
  for (std::size_t li = 0; li < c_.shards.size(); ++li) {
    if (tier(static_cast<int>(li)) != Tier::nvme) continue;
    swap_index_[li] = static_cast<int>(swap_layers_.size());
    swap_layers_.push_back(static_cast<int>(li));
  }
  swapper_ = std::make_unique<offload::OptimizerSwapper>(so, swap_tensors(c_.layout, c_.shards));
  const std::uint64_t buffers = swapper_->buffer_bytes() * static_cast<std::uint64_t>(swapper_->buffer_count());
  c_.ledger.charge(Tier::host, Kind::buffers, buffers, "the NVMe optimizer swap buffers");
  swap_buffer_bytes_ = buffers;
  c_.ledger.charge(Tier::nvme, Kind::optimizer, swapper_->file_bytes(),
                   str_cat("the optimizer swap files in ", so.dir,
                           so.spare_sub_groups == 0 ? " (two generations)" : " (the state and its spare files)"));
  swap_file_bytes_ = swapper_->file_bytes();
}

void OptimizerState::commit_writes() {
  if (swapper_) swapper_->commit_written();
}

void OptimizerState::discard_writes() noexcept {
  if (swapper_) swapper_->discard_written();
}

std::vector<offload::OptimizerSwapper::SealedFile> OptimizerState::sealed_files(int li) const {
  if (swapper_ == nullptr || tier(li) != Tier::nvme) return {};
  return swapper_->sealed_files(static_cast<std::size_t>(swap_index(li)));
}

std::optional<checkpoint::LinkedRun> OptimizerState::linked_run() const {
  const auto* sw = swapper_.get();
  if (sw == nullptr) return std::nullopt;
  checkpoint::LinkedRun run{.swap_dir = sw->dir(), .run_files = sw->all_files(), .linked_by_save = {}};
  for (std::size_t t = 0; t < sw->tensors(); ++t)
    for (const auto& f : sw->sealed_files(t)) run.linked_by_save.push_back(f.path);
  return run;
}

void OptimizerState::step_swapped(const std::function<void(int li, const offload::SubGroup& g)>& fn, IoStats& io) {
  if (swapper_ == nullptr) return;
  if (swapper_->pending()) {  // the overlapped step's update, kept
    swapper_->commit_pending();
    return;
  }
  swapper_->step([&](const offload::SubGroup& g) { fn(swap_layers_[g.tensor], g); });
  add_swap_traffic(io);
}

bool OptimizerState::has_swapped() const { return swapper_ != nullptr; }

std::size_t OptimizerState::swapped_layers() const { return swapper_ == nullptr ? 0 : swapper_->tensors(); }

int OptimizerState::swapped_layer(std::size_t t) const { return swap_layers_[t]; }

offload::OptimizerSwapper::Step OptimizerState::begin_swapped(const offload::OptimizerSwapper::StepOrder& order) {
  return swapper_->begin_step(order);
}

void OptimizerState::commit_pending() {
  if (swapper_) swapper_->commit_pending();
}

void OptimizerState::discard_pending() noexcept {
  if (swapper_) swapper_->discard_pending();
}

void OptimizerState::committed_masters(
    int li, const std::function<void(std::uint64_t first, const float* master, std::uint64_t n)>& fn) {
  swapper_->visit_masters(static_cast<std::size_t>(swap_index(li)), fn);
}

void OptimizerState::add_swap_traffic(IoStats& io) {
  if (swapper_ == nullptr) return;
  const auto ss = swapper_->stats();
  io.nvme_read_bytes += ss.bytes_read;
  io.nvme_write_bytes += ss.bytes_written;
  io.io_wait_seconds += ss.wait_seconds;
}

}  // namespace strata::engine
