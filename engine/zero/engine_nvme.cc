// The engine's NVMe tier for optimizer state (offload_optimizer.device nvme): the swapper
// that holds this rank's fp32 master, exp_avg and exp_avg_sq shards, one tensor per layer,
// under offload_optimizer.nvme_path/rank<R>, with its buffers charged to the host tier.
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/zero/detail/engine_impl.h"

namespace strata::zero {

void Engine::Impl::setup_swapper() {
  const OffloadConfig& oc = cfg.offload_optimizer;
  offload::SwapperOptions so;
  so.dir = oc.nvme_path + "/rank" + std::to_string(rank);
  so.sub_group_elems = cfg.zero.sub_group_size;
  so.buffer_count = oc.buffer_count > 0 ? oc.buffer_count : 4;
  so.budget_bytes = ledger->available(Tier::host);
  so.queue_depth = static_cast<unsigned>(cfg.aio.queue_depth);
  so.block_bytes = static_cast<std::uint32_t>(cfg.aio.block_size);
  std::vector<offload::SwapTensor> tensors;
  for (std::size_t li = 0; li < layers.size(); ++li) {
    tensors.push_back({str_cat("layer ", layout->layers()[li].id), layers[li].shard_total});
  }
  swapper = std::make_unique<offload::OptimizerSwapper>(so, std::move(tensors));
  swap_buffer_bytes = swapper->buffer_bytes() * static_cast<std::uint64_t>(swapper->buffer_count());
  ledger->charge(Tier::host, Kind::buffers, swap_buffer_bytes, "the NVMe optimizer swap buffers");
}

void Engine::Impl::read_master_shard(int li, float* out) {
  swapper->read_master(static_cast<std::size_t>(li), 0, layers[li].shard_total, out);
}

}  // namespace strata::zero
