// The engine's NVMe tier (the protocol in nvme_homes.h).
#include "engine/nvme_homes.h"

#include "runtime/core/error.h"
#include "runtime/core/log.h"
#include "runtime/core/units.h"

namespace strata::engine {

NvmeHomes::NvmeHomes(const Context& ctx) : c_(ctx) {}

NvmeHomes::~NvmeHomes() {
  io_.reset();  // finishes what is queued: write-backs still read their staging
  drop(params_);
  swapper_.reset();
  if (swap_buffer_bytes_) c_.ledger.discharge(Tier::host, Kind::buffers, swap_buffer_bytes_);
  if (swap_file_bytes_) c_.ledger.discharge(Tier::nvme, Kind::optimizer, swap_file_bytes_);
}

// DeepSpeed's libaio knobs that io_uring makes moot are said so, once, rather than ignored.
void NvmeHomes::warn_aio_knobs() const {
  if (c_.cfg.aio.intra_op_parallelism != 1) {
    warn_once("aio.intra_op_parallelism",
              str_cat("aio.intra_op_parallelism = ", c_.cfg.aio.intra_op_parallelism,
                      " has no effect: Strata's io_uring engine needs no I/O threads (aio.queue_depth "
                      "keeps the drive busy)"));
  }
  if (!c_.cfg.aio.overlap_events) {
    warn_once("aio.overlap_events",
              "aio.overlap_events = false has no effect: io_uring always overlaps submission and "
              "completion");
  }
}

std::string NvmeHomes::lock_rank_dir(const std::string& nvme_path, const char* key) {
  const std::string dir = nvme_path + "/rank" + std::to_string(c_.rank);
  for (const auto& held : locks_)
    if (held.dir() == dir) return dir;
  locks_.emplace_back(dir, key);
  return dir;
}

void NvmeHomes::open_swapper(const std::vector<Tier>& opt_tiers) {
  const OffloadConfig& oc = c_.cfg.offload_optimizer;
  STRATA_CHECK(!oc.nvme_path.empty(), Errc::invalid_argument,
               "optimizer state is placed on NVMe but offload_optimizer.nvme_path is not set: give a directory on the "
               "NVMe drive");
  offload::SwapperOptions so;
  so.dir = lock_rank_dir(oc.nvme_path, "offload_optimizer.nvme_path");
  so.sub_group_elems = c_.cfg.zero.sub_group_size;
  so.buffer_count = oc.buffer_count > 0 ? oc.buffer_count : 4;
  so.budget_bytes = c_.ledger.available(Tier::host);
  so.queue_depth = static_cast<unsigned>(c_.cfg.aio.queue_depth);
  so.block_bytes = static_cast<std::uint32_t>(c_.cfg.aio.block_size);
  so.submit_batch = c_.cfg.aio.single_submit ? 1 : 8;
  so.tracer = c_.tracer;
  warn_aio_knobs();
  std::vector<offload::SwapTensor> tensors;
  swap_index_.assign(opt_tiers.size(), -1);
  for (std::size_t li = 0; li < opt_tiers.size(); ++li) {
    if (opt_tiers[li] != Tier::nvme) continue;
    swap_index_[li] = static_cast<int>(swap_layers_.size());
    swap_layers_.push_back(static_cast<int>(li));
    tensors.push_back({str_cat("layer ", c_.layout.layers()[li].id), c_.layout.layer_shard(static_cast<int>(li))});
  }
  swapper_ = std::make_unique<offload::OptimizerSwapper>(so, std::move(tensors));
  const std::uint64_t buffers = swapper_->buffer_bytes() * static_cast<std::uint64_t>(swapper_->buffer_count());
  c_.ledger.charge(Tier::host, Kind::buffers, buffers, "the NVMe optimizer swap buffers");
  swap_buffer_bytes_ = buffers;
  c_.ledger.charge(Tier::nvme, Kind::optimizer, swapper_->file_bytes(),
                   str_cat("the optimizer swap files in ", so.dir, " (two generations)"));
  swap_file_bytes_ = swapper_->file_bytes();
}

NvmeHomes::ParamFiles NvmeHomes::build_params(const std::vector<Tier>& tiers, const std::string& subdir) {
  const OffloadConfig& pc = c_.cfg.offload_param;
  STRATA_CHECK(
      !pc.nvme_path.empty(), Errc::invalid_argument,
      "parameters are placed on NVMe but offload_param.nvme_path is not set: give a directory on the NVMe drive");
  offload::ParamStoreOptions po;
  po.dir = lock_rank_dir(pc.nvme_path, "offload_param.nvme_path") + "/" + subdir;
  po.chunk_bytes = (pc.buffer_size > 0 ? pc.buffer_size : 100000000) * c_.cbytes;
  po.buffer_count = pc.buffer_count > 0 ? pc.buffer_count : 5;
  po.budget_bytes = c_.ledger.available(Tier::host);
  po.queue_depth = static_cast<unsigned>(c_.cfg.aio.queue_depth);
  po.block_bytes = static_cast<std::uint32_t>(c_.cfg.aio.block_size);
  po.submit_batch = c_.cfg.aio.single_submit ? 1 : 8;
  warn_aio_knobs();
  ParamFiles b;
  b.subdir = subdir;
  b.index.assign(tiers.size(), -1);
  std::vector<offload::ParamTensor> tensors;
  for (std::size_t li = 0; li < tiers.size(); ++li) {
    if (tiers[li] != Tier::nvme) continue;
    b.index[li] = static_cast<int>(tensors.size());
    tensors.push_back(
        {str_cat("layer ", c_.layout.layers()[li].id), c_.layout.layer_shard(static_cast<int>(li)) * c_.cbytes});
  }
  b.store = std::make_unique<offload::ParamStore>(po, std::move(tensors));
  const std::uint64_t buffers = b.store->buffer_bytes() * static_cast<std::uint64_t>(b.store->buffer_count());
  c_.ledger.charge(Tier::host, Kind::buffers, buffers, "the NVMe parameter buffers");
  try {
    c_.ledger.charge(Tier::nvme, Kind::params, b.store->file_bytes(),
                     str_cat("the parameter swap files in ", po.dir, " (two generations)"));
  } catch (...) {
    c_.ledger.discharge(Tier::host, Kind::buffers, buffers);
    throw;
  }
  b.buffer_bytes = buffers;
  b.file_bytes = b.store->file_bytes();
  return b;
}

void NvmeHomes::drop(ParamFiles& b) noexcept {
  b.store.reset();
  if (b.buffer_bytes) c_.ledger.discharge(Tier::host, Kind::buffers, b.buffer_bytes);
  if (b.file_bytes) c_.ledger.discharge(Tier::nvme, Kind::params, b.file_bytes);
  b.buffer_bytes = b.file_bytes = 0;
}

void NvmeHomes::open_params(const std::vector<Tier>& param_tiers) {
  params_ = build_params(param_tiers, "params");
  io_ = std::make_unique<offload::IoWorker>(c_.dev);
}

void NvmeHomes::adopt(ParamFiles&& files) {
  drain();
  drop(params_);
  params_ = std::move(files);
  if (!io_) io_ = std::make_unique<offload::IoWorker>(c_.dev);
}

void NvmeHomes::drain() {
  if (io_) io_->synchronize();
}

}  // namespace strata::engine
