// The engine's memory per tier and kind before anything is allocated (the protocol in
// memory_estimate.h).
#include "engine/memory_estimate.h"

#include <algorithm>

#include "engine/grad_reducer.h"
#include "engine/nvme_homes.h"
#include "engine/optimizer_state.h"
#include "engine/placement_plan.h"
#include "offload/optimizer_swapper.h"
#include "offload/param_store.h"
#include "runtime/core/error.h"
#include "runtime/core/units.h"

namespace strata::engine {
namespace {

std::uint64_t& at(MemoryEstimate& e, Tier t, Kind k) {
  return e.tiers[static_cast<std::size_t>(t)].kind[static_cast<std::size_t>(k)];
}

// The ledger refuses an allocation past a tier's budget: so does the estimate, naming the
// budget that would do (the device's fit is the placement's check).
void check_budget(const EstimateInput& in, const MemoryEstimate& e, Tier t) {
  const std::uint64_t budget = t == Tier::host ? in.config.memory_budget.host : in.config.memory_budget.nvme;
  const std::uint64_t need = e.tiers[static_cast<std::size_t>(t)].total();
  STRATA_CHECK(budget == 0 || need <= budget, Errc::out_of_budget, tier_name(t), " tier: this run needs at least ",
               format_bytes(need), " (", need, " B) there but memory_budget.", tier_name(t), " is ",
               format_bytes(budget), ": raise memory_budget.", tier_name(t), " to at least ", need,
               " B or place less there");
}

// What setup() allocates for every layer where the plan puts it, and the NVMe stores.
void add_model_state(const EstimateInput& in, const Layout& lay, const PlacementPlan& plan, MemoryEstimate& e) {
  const ShardMap& shards = plan.shards();
  const int stage = in.config.zero.stage;
  const std::uint64_t c = dtype_size(compute_dtype_of(in.config));
  const std::uint64_t host_acc = dtype_size(
      GradReducer::host_acc_dtype(compute_dtype_of(in.config), in.world, in.config.gradient_accumulation_steps));
  for (std::size_t li = 0; li < lay.layers().size(); ++li) {
    const int l = static_cast<int>(li);
    const auto& L = lay.layers()[li];
    if (!L.frozen) {  // a frozen layer: its parameters only
      if (shards.opt_tier(l) != Tier::nvme)
        at(e, shards.opt_tier(l), Kind::optimizer) +=
            state_bytes(in.config.optimizer, OptimizerState::elems(lay, stage, l)) - plan.muon_saving(l);
      at(e, shards.acc_on_host(l) ? Tier::host : Tier::device, Kind::grads) +=
          (shards.acc_on_host(l) ? host_acc : 4) * GradReducer::acc_elems(lay, stage, l);
    }
    if (stage <= 2 || shards.persistent(l)) at(e, Tier::device, Kind::params) += L.padded * c;
    if (stage == 3 && shards.param_tier(l) != Tier::nvme)
      at(e, shards.param_tier(l), Kind::params) += lay.layer_shard(l) * c;
  }
  // The NVMe stores are opened after the reducer's scratch, with what the host budget leaves.
  const std::uint64_t scratch = GradReducer::host_scratch_bytes(lay, c, shards.any_acc_on_host());
  at(e, Tier::host, Kind::buffers) += scratch;
  check_budget(in, e, Tier::host);  // the reducer allocates first
  at(e, Tier::device, Kind::buffers) += GradReducer::device_scratch_bytes(lay, in.device_collectives);
  const std::uint64_t host_budget = host_budget_of(in.config);
  // As setup opens them: each store sized to what the budget leaves beside everything
  // allocated after it (PlacementPlan::HostParts).
  const PlacementPlan::HostParts parts = plan.host_parts();
  std::uint64_t host_used = scratch + parts.after_stores();
  at(e, Tier::host, Kind::buffers) += parts.muon;  // Muon's gathers and held updates (setup charges them)
  if (shards.any_opt_on(Tier::nvme)) {
    const auto f = offload::OptimizerSwapper::footprint(
        OptimizerState::swapper_options(in.config, host_budget - std::min(host_budget, host_used + parts.param_min)),
        OptimizerState::swap_tensors(lay, plan.shards()));
    at(e, Tier::nvme, Kind::optimizer) += f.file_bytes;
    e.swap_file_host_bytes += f.host_bytes;
    at(e, Tier::host, Kind::buffers) += f.buffer_bytes * static_cast<std::uint64_t>(f.buffer_count);
    host_used += f.buffer_bytes * static_cast<std::uint64_t>(f.buffer_count);
  }
  if (shards.any_params_on(Tier::nvme)) {
    const auto f = offload::ParamStore::footprint(
        NvmeHomes::param_options(in.config, c, host_budget - std::min(host_budget, host_used)),
        NvmeHomes::param_tensors(lay, c, shards.param_tiers()));
    at(e, Tier::nvme, Kind::params) += f.file_bytes;
    e.swap_file_host_bytes += f.host_bytes;
    at(e, Tier::host, Kind::buffers) += f.buffer_bytes * static_cast<std::uint64_t>(f.buffer_count);
  }
}

// Elements prefetched ahead of use at most: from each point of the host-trainer contract's
// gather order (forward, then backward), the next layers not yet gathered, whole, within
// stage3_prefetch_bucket_size and `limit` (gather_path.h).
std::uint64_t prefetch_elems(const EngineConfig& cfg, const Layout& lay, const PlacementPlan& plan,
                             std::uint64_t limit) {
  std::vector<int> order;
  for (std::size_t li = 0; li < lay.layers().size(); ++li)
    if (!plan.shards().persistent(static_cast<int>(li))) order.push_back(static_cast<int>(li));
  for (std::size_t k = order.size(); k-- > 0;) order.push_back(order[k]);
  std::uint64_t most = 0;
  for (std::size_t start = 0; start < order.size(); ++start) {
    std::vector<bool> seen(lay.layers().size(), false);
    std::uint64_t issued = 0;
    for (std::size_t k = start + 1; k < order.size(); ++k) {
      const std::uint64_t need = lay.layers()[order[k]].padded;
      if (seen[order[k]] || order[k] == order[start]) continue;
      if (issued + need > std::min(cfg.zero.stage3_prefetch_bucket_size, limit)) break;
      seen[order[k]] = true;
      issued += need;
    }
    most = std::max(most, issued);
  }
  return most;
}

// The gradient buffer the trainer fills, and with overlap_comm those the queued reductions
// still hold (GradReducer::max_in_flight): the largest layers' at most.
std::uint64_t grad_buffer_bytes(const EstimateInput& in, const Layout& lay, std::uint64_t c) {
  std::vector<std::uint64_t> sizes;
  for (const auto& L : lay.layers())
    if (!L.frozen) sizes.push_back(L.padded);  // a frozen layer takes no gradient buffer
  if (sizes.empty()) return 0;
  std::sort(sizes.rbegin(), sizes.rend());
  const std::size_t held = in.config.zero.overlap_comm ? 1 + GradReducer::max_in_flight(in.world) : 1;
  std::uint64_t bytes = 0;
  for (std::size_t k = 0; k < held; ++k) bytes += sizes[std::min(k, sizes.size() - 1)] * c;
  return bytes;
}

// What a tier can still take: the budget less what the estimate already put there.
std::uint64_t room(const MemoryEstimate& e, Tier t, std::uint64_t budget, std::uint64_t others = 0) {
  std::uint64_t held = others;
  for (auto k : e.tiers[static_cast<std::size_t>(t)].kind) held += k;
  return budget > held ? budget - held : 0;
}

// Bounds of the buffers a step holds for a while (the protocol in memory_estimate.h).
void add_step_buffers(const EstimateInput& in, const Layout& lay, const PlacementPlan& plan, MemoryEstimate& e) {
  const ShardMap& shards = plan.shards();
  const auto& z = in.config.zero;
  const std::uint64_t c = dtype_size(compute_dtype_of(in.config));
  const std::uint64_t largest = lay.largest_layer_padded();
  std::uint64_t gathered = 0, device_copy = 0, staged = 0, nvme_copies = 0, nvme_sum = 0;
  bool paced = true;  // every NVMe parameter layer's optimizer waits on its own NVMe state
  bool lane = false;  // an overlapped optimizer step runs during backward (some state on NVMe)
  for (std::size_t li = 0; li < lay.layers().size(); ++li) {
    const int l = static_cast<int>(li);
    const std::uint64_t copies = OptimizerState::elems(lay, z.stage, l) * c;
    lane = lane || (in.config.offload_optimizer.overlap_step && shards.opt_tier(l) == Tier::nvme);
    if (z.stage == 3 && !shards.persistent(l)) gathered += lay.layers()[li].padded;
    if (lay.layers()[li].frozen) continue;  // no update: nothing staged or copied for it
    if (z.stage == 3 && shards.opt_tier(l) == Tier::device && shards.param_tier(l) != Tier::device)
      device_copy = std::max(device_copy, copies);
    if (shards.param_tier(l) == Tier::nvme) {
      nvme_copies = std::max(nvme_copies, copies);
      nvme_sum += copies;
      paced = paced && shards.opt_tier(l) == Tier::nvme;
    } else if (shards.opt_tier(l) != Tier::device && shards.param_tier(l) == Tier::device) {
      staged = std::max(staged, copies);
    }
  }
  // The device: in forward and backward the gathered window (stage 3: layers stay gathered,
  // prefetched or retained, while the device has room beside the gradient buffers' reserve and
  // the live limit allows; at least the largest layer, which setup() checked) and the
  // gradient buffers; in the optimizer step the device optimizer's copies of off-device shards.
  const std::uint64_t device_room = room(e, Tier::device, in.device_budget, in.trainer_device_bytes);
  const std::uint64_t reserve = largest * c * (z.overlap_comm ? 2 : 1);  // GatherPath's room for backward
  const std::uint64_t fits = device_room > reserve ? (device_room - reserve) / c : 0;
  std::uint64_t window = 0;  // elements
  if (z.stage == 3 && gathered > 0)
    window = std::max(std::min({gathered, z.stage3_max_live_parameters, fits}), largest);
  e.window_elems = window;
  e.largest_layer_padded = largest;
  const std::uint64_t passes = grad_buffer_bytes(in, lay, c) + window * c;
  at(e, Tier::device, Kind::buffers) += std::max(std::min(std::max(passes, device_copy), device_room), largest * c);
  // Host: updated copies staged during the optimizer step (one layer for the host link; for
  // NVMe the layer being filled and the one whose write-back holds it, which UpdateStaging
  // enforces for layers whose state is on NVMe, or every layer's when an optimizer that does
  // not wait on NVMe outruns the write-backs); gather staging (pinned)
  // of the layer gathered on demand or of those prefetched, each also in the device window.
  // The step's write-backs run into the next step, so its first gathers may stage beside the
  // last write-back's copies (beside all of them when they outran the NVMe). The host budget
  // caps it: a full host tier waits for write-backs. With the overlapped step the optimizer's
  // staging comes during backward, beside the gathers' own.
  staged = std::max(staged, paced ? std::min(nvme_sum, 2 * nvme_copies) : nvme_sum);
  const std::uint64_t gather_staging =
      window > 0 ? std::max(largest, prefetch_elems(in.config, lay, plan, window)) * c : 0;
  const std::uint64_t host = paced && !lane ? std::max(staged, gather_staging + nvme_copies) : staged + gather_staging;
  at(e, Tier::host, Kind::buffers) += std::min(host, room(e, Tier::host, host_budget_of(in.config)));
}

// The overlapped step's spare arrays of host layers (OptimizerState::spare), which
// OverlappedStep allocates at its first step.
void add_overlap_spares(const EstimateInput& in, const Layout& lay, const PlacementPlan& plan, MemoryEstimate& e) {
  const auto& c = in.config;
  if (!overlaps_host_state(c, plan.shards().any_opt_on(Tier::nvme))) return;
  for (std::size_t li = 0; li < lay.layers().size(); ++li) {
    const int l = static_cast<int>(li);
    if (plan.shards().opt_tier(l) == Tier::host)
      at(e, Tier::host, Kind::optimizer) += state_bytes(c.optimizer, OptimizerState::elems(lay, c.zero.stage, l));
  }
}

}  // namespace

std::uint64_t TierEstimate::total() const noexcept {
  std::uint64_t n = 0;
  for (auto k : kind) n += k;
  return n;
}

MemoryEstimate estimate_memory(const EstimateInput& in) {
  const Layout lay(in.params, in.world, in.config.zero.reduce_bucket_size);
  const PlacementPlan::Context pc{.cfg = in.config,
                                  .layout = lay,
                                  .rank = in.rank,
                                  .world = in.world,
                                  .cbytes = dtype_size(compute_dtype_of(in.config)),
                                  .device_budget = in.device_budget,
                                  .device_in_host_ram = in.device_in_host_ram,
                                  .comm = nullptr,
                                  .device_collectives = in.device_collectives,
                                  .device_held_by_others = in.trainer_device_bytes,
                                  .layers_at_once = in.layers_at_once};
  PlacementPlan plan(pc, PlacementPlan::persistent_layers(in.config, lay));
  plan.place();              // refuses what fits nowhere, naming the smallest budget that would
  plan.check_host_budget();  // as setup does, before anything is allocated
  plan.check_nvme_budget();
  MemoryEstimate e;
  e.device_minimum = plan.device_minimum();
  e.trainer_device_bytes = in.trainer_device_bytes;
  e.params = lay.total_numel();
  for (const auto& L : lay.layers()) e.largest_layer_params = std::max<std::uint64_t>(e.largest_layer_params, L.numel);
  e.placement = plan.explain();
  for (std::size_t li = 0; li < lay.layers().size(); ++li)
    if (!lay.layers()[li].frozen)
      e.optimizer_elems += OptimizerState::elems(lay, in.config.zero.stage, static_cast<int>(li));
  const offload::Placement moved = plan.traffic();
  e.h2d_bytes = moved.h2d_bytes;
  e.d2h_bytes = moved.d2h_bytes;
  e.nvme_read_bytes = moved.nvme_read_bytes;
  e.nvme_write_bytes = moved.nvme_write_bytes;
  add_model_state(in, lay, plan, e);
  add_step_buffers(in, lay, plan, e);
  add_overlap_spares(in, lay, plan, e);
  check_budget(in, e, Tier::host);
  check_budget(in, e, Tier::nvme);
  return e;
}

}  // namespace strata::engine
