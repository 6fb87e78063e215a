// The placement's NVMe tier: the spare swap files it reserves before placing (the planner's
// fixed NVMe bytes) and the exact check of every swap file against memory_budget.nvme once the
// layers are placed (the protocol in placement_plan.h).
#include <vector>

#include "engine/nvme_homes.h"
#include "engine/optimizer_state.h"
#include "engine/placement_plan.h"
#include "offload/optimizer_swapper.h"
#include "offload/param_store.h"
#include "runtime/core/error.h"
#include "runtime/core/units.h"

namespace strata::engine {
namespace {

constexpr std::uint64_t kRoom = ~std::uint64_t{0} / 4;  // the files' sizes do not depend on the buffers

}  // namespace

PlacementPlan::NvmeSpares PlacementPlan::nvme_spares() const {
  // A store's spare files are what its footprint holds beyond its tensors' bytes once (half of
  // what two generations take), for a store of every layer that may go there. Spares are kept
  // per chunk length, so a store of fewer layers usually makes no more: this is what the
  // planner reserves, and check_nvme_budget() counts the files exactly once layers are placed.
  NvmeSpares out;
  const Layout& lay = c_.layout;
  // Without a store's nvme_path, nothing of its kind may go to NVMe.
  if (c_.cfg.offload_optimizer.spare_sub_groups > 0 && !c_.cfg.offload_optimizer.nvme_path.empty()) {
    std::vector<offload::SwapTensor> tensors;
    for (std::size_t li = 0; li < lay.layers().size(); ++li)
      if (!lay.layers()[li].frozen)
        tensors.push_back({str_cat("layer ", lay.layers()[li].id), lay.layer_shard(static_cast<int>(li))});
    if (!tensors.empty()) {
      offload::SwapperOptions o = OptimizerState::swapper_options(c_.cfg, kRoom);
      const std::uint64_t with = offload::OptimizerSwapper::footprint(o, tensors).file_bytes;
      o.spare_sub_groups = 0;
      out.state = with - offload::OptimizerSwapper::footprint(o, tensors).file_bytes / 2;
    }
  }
  if (c_.cfg.zero.stage == 3 && c_.cfg.offload_param.spare_chunks > 0 && !c_.cfg.offload_param.nvme_path.empty() &&
      !lay.layers().empty()) {
    const auto tensors = NvmeHomes::param_tensors(lay, c_.cbytes, std::vector<Tier>(lay.layers().size(), Tier::nvme));
    offload::ParamStoreOptions o = NvmeHomes::param_options(c_.cfg, c_.cbytes, kRoom);
    const std::uint64_t with = offload::ParamStore::footprint(o, tensors).file_bytes;
    o.spares = 0;
    out.params = with - offload::ParamStore::footprint(o, tensors).file_bytes / 2;
  }
  return out;
}

void PlacementPlan::check_nvme_budget() const {
  const std::uint64_t budget = c_.cfg.memory_budget.nvme;
  if (budget == 0) return;
  std::uint64_t opt_files = 0, param_files = 0;
  if (shards_.any_opt_on(Tier::nvme))
    opt_files = offload::OptimizerSwapper::footprint(OptimizerState::swapper_options(c_.cfg, kRoom),
                                                     OptimizerState::swap_tensors(c_.layout, shards_))
                    .file_bytes;
  if (shards_.any_params_on(Tier::nvme))
    param_files = offload::ParamStore::footprint(NvmeHomes::param_options(c_.cfg, c_.cbytes, kRoom),
                                                 NvmeHomes::param_tensors(c_.layout, c_.cbytes, shards_.param_tiers()))
                      .file_bytes;
  const std::uint64_t need = opt_files + param_files;
  const bool opt_spares = c_.cfg.offload_optimizer.spare_sub_groups > 0;
  const bool param_spares = c_.cfg.offload_param.spare_chunks > 0;
  if (need <= budget) return;
  // What holds the bytes: two generations (a step's writes never overwrite the last commit) or
  // once plus spare files.
  auto kept = [](bool spares) { return spares ? "once plus spare files" : "in two generations"; };
  std::string parts;
  if (opt_files > 0) parts = str_cat(format_bytes(opt_files), " of optimizer state files (", kept(opt_spares), ")");
  if (param_files > 0)
    parts += str_cat(parts.empty() ? "" : " and ", format_bytes(param_files), " of parameter files (",
                     kept(param_spares), ")");
  STRATA_THROW(
      Errc::out_of_budget, "NVMe tier: this placement's swap files need ", format_bytes(need), " (", need,
      " B) but memory_budget.nvme is ", format_bytes(budget), ": ", parts, ". Raise memory_budget.nvme to at least ",
      need, " B, or place less on NVMe (offload_optimizer.device / offload_param.device \"cpu\")",
      opt_files > 0 && !opt_spares
          ? ", or keep the optimizer state once plus spares (offload_optimizer.spare_sub_groups 2)"
          : "",
      param_files > 0 && !param_spares ? ", or the parameter shards once plus spares (offload_param.spare_chunks 2)"
                                       : "");
}

}  // namespace strata::engine
