// The placement policy (the protocol in placement_plan.h).
#include "engine/placement_plan.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <sstream>

#include "engine/detail/muon_runs.h"
#include "engine/grad_reducer.h"
#include "engine/nvme_homes.h"
#include "engine/optimizer_state.h"
#include "offload/optimizer_swapper.h"
#include "offload/param_store.h"
#include "runtime/comm/communicator.h"
#include "runtime/core/error.h"
#include "runtime/core/host_memory.h"
#include "runtime/core/log.h"
#include "runtime/core/units.h"
#include "runtime/device/arena.h"

namespace strata::engine {
namespace {

Tier tier_of(OffloadDevice d) {
  return d == OffloadDevice::cpu ? Tier::host : d == OffloadDevice::nvme ? Tier::nvme : Tier::device;
}

}  // namespace

PlacementPlan::PlacementPlan(const Context& ctx, const std::vector<bool>& persistent) : c_(ctx), shards_(persistent) {}

std::vector<bool> PlacementPlan::persistent_layers(const EngineConfig& cfg, const Layout& layout) {
  std::vector<bool> out;
  for (const auto& L : layout.layers())
    out.push_back(cfg.zero.stage == 3 && L.numel < cfg.zero.stage3_param_persistence_threshold);
  return out;
}

std::uint64_t PlacementPlan::device_scratch_bytes() const {
  return GradReducer::device_scratch_bytes(c_.layout, c_.device_collectives);
}

bool PlacementPlan::budget_driven() const {
  const auto& b = c_.cfg.memory_budget;
  return (b.device || b.host || b.nvme) &&
         (c_.cfg.offload_optimizer.device == OffloadDevice::none ||
          (c_.cfg.zero.stage == 3 && c_.cfg.offload_param.device == OffloadDevice::none));
}

offload::Placement PlacementPlan::traffic() const {
  std::vector<offload::LayerPlacement> places;
  for (std::size_t li = 0; li < shards_.size(); ++li) {
    const int i = static_cast<int>(li);
    places.push_back({shards_.opt_tier(i), shards_.param_tier(i)});
  }
  return offload::evaluate_placement(make_problem({}), places);
}

bool PlacementPlan::muon_scan(int li) const {
  return c_.cfg.optimizer.type == OptimizerType::muon && detail::holds_muon_matrix(c_.layout, li);
}

std::uint64_t PlacementPlan::muon_saving(int li) const {
  return muon_scan(li) ? 4 * detail::fewest_matrix_elems(c_.layout, c_.cfg.zero.stage, li) : 0;
}

std::uint64_t PlacementPlan::muon_scratch() const {
  const bool sharded = c_.cfg.optimizer.type == OptimizerType::muon && c_.cfg.zero.stage > 0;
  return sharded ? detail::muon_host_scratch(c_.layout, c_.world) : 0;
}

std::uint32_t PlacementPlan::host_acc_bytes() const {
  return static_cast<std::uint32_t>(
      dtype_size(GradReducer::host_acc_dtype(compute_dtype_of(c_.cfg), c_.world, c_.cfg.gradient_accumulation_steps)));
}

offload::PlacementProblem PlacementPlan::make_problem(const std::vector<int>& gathers) const {
  const int stage = c_.cfg.zero.stage;
  const Layout& lay = c_.layout;
  offload::PlacementProblem p;
  p.stage = stage;
  p.compute_bytes = static_cast<std::uint32_t>(c_.cbytes);
  p.accumulation_steps = static_cast<int>(std::max<std::int64_t>(1, c_.cfg.gradient_accumulation_steps));
  p.host_accumulator_bytes = host_acc_bytes();
  std::uint64_t persistent = 0, largest_shard = 0;
  for (std::size_t li = 0; li < shards_.size(); ++li) {
    const auto& L = lay.layers()[li];
    offload::PlacementLayer pl;
    pl.name = str_cat("layer ", L.id);
    pl.shard_elems = OptimizerState::elems(lay, stage, static_cast<int>(li));
    pl.padded_elems = L.padded;
    pl.gathers_per_step = gathers.empty() ? 2 * p.accumulation_steps : gathers[li];
    pl.frozen = L.frozen;
    pl.nvme_scan = muon_scan(static_cast<int>(li));
    pl.resident_saving = muon_saving(static_cast<int>(li));
    p.layers.push_back(pl);
    if (shards_.persistent(static_cast<int>(li))) persistent += L.padded * c_.cbytes;
    largest_shard = std::max<std::uint64_t>(largest_shard, shard(static_cast<int>(li)));
  }
  const std::uint64_t largest = lay.largest_layer_padded();
  p.device_budget = device_room();
  p.device_held = c_.device_held_by_others;
  p.host_budget = c_.cfg.memory_budget.host ? c_.cfg.memory_budget.host : ~std::uint64_t{0};
  p.nvme_budget = c_.cfg.memory_budget.nvme;
  // Swap files hold two generations; with spare files, once plus the spares.
  p.nvme_copies = c_.cfg.offload_param.spare_chunks == 0 ? 2 : 1;
  p.nvme_state_copies = c_.cfg.offload_optimizer.spare_sub_groups == 0 ? 2 : 1;
  const NvmeSpares spares = nvme_spares();
  p.nvme_state_spare_bytes = spares.state;
  p.nvme_param_spare_bytes = spares.params;
  p.state_bytes = state_bytes_per_elem(c_.cfg.optimizer);
  p.device_gathers = c_.device_collectives;
  p.nvme_available = !c_.cfg.offload_optimizer.nvme_path.empty() || !c_.cfg.offload_param.nvme_path.empty();
  // Live window + persistent layers (+ the device reduction scratch with device collectives).
  p.device_fixed_bytes = device::Arena::round_up(largest * c_.cbytes) * 2 + persistent + device_scratch_bytes();
  // Reduction scratch, gradient staging, one gather's staging, one layer's updated shards.
  p.host_fixed_bytes = GradReducer::host_scratch_bytes(lay, c_.cbytes, true) + (stage == 3 ? largest * c_.cbytes : 0) +
                       largest_shard * c_.cbytes + muon_scratch();
  const int opt_buffers = c_.cfg.offload_optimizer.buffer_count > 0 ? c_.cfg.offload_optimizer.buffer_count : 4;
  const std::uint64_t sub_group =
      std::min<std::uint64_t>(c_.cfg.zero.sub_group_size, std::max<std::uint64_t>(1, largest_shard));
  p.nvme_buffer_bytes =
      static_cast<std::uint64_t>(opt_buffers) * ((state_bytes(c_.cfg.optimizer, sub_group) + 4095) / 4096 * 4096);
  if (stage == 3) {
    const int par_buffers = c_.cfg.offload_param.buffer_count > 0 ? c_.cfg.offload_param.buffer_count : 5;
    const std::uint64_t chunk = std::min<std::uint64_t>(c_.cfg.offload_param.buffer_size, largest_shard) * c_.cbytes;
    p.nvme_buffer_bytes += static_cast<std::uint64_t>(par_buffers) * ((chunk + 4095) / 4096 * 4096);
  }
  if (c_.cfg.offload_optimizer.device != OffloadDevice::none)
    p.optimizer_fixed = tier_of(c_.cfg.offload_optimizer.device);
  if (stage < 3)
    p.params_fixed = offload::Tier::device;
  else if (c_.cfg.offload_param.device != OffloadDevice::none)
    p.params_fixed = tier_of(c_.cfg.offload_param.device);
  return p;
}

void PlacementPlan::place() {
  const int stage = c_.cfg.zero.stage;
  const Tier opt = tier_of(c_.cfg.offload_optimizer.device);
  const Tier par = stage == 3 ? tier_of(c_.cfg.offload_param.device) : Tier::device;
  if (budget_driven()) {
    const offload::PlacementProblem problem = make_problem({});
    const offload::Placement plan = offload::plan_placement(problem);  // refuses, naming the budget to raise
    for (std::size_t li = 0; li < shards_.size(); ++li) {
      const int i = static_cast<int>(li);
      const Tier params = plan.layers[li].params;
      shards_.place(i, c_.layout.layers()[li].frozen ? Tier::device : plan.layers[li].optimizer,
                    shards_.persistent(i) && params == Tier::nvme ? Tier::host : params);
    }
    text_ = str_cat("placement (budget-driven, memory_budget), rank ", c_.rank, ":\n", plan.explain(problem),
                    frozen_note());
    device_minimum_ = check_device_fit(opt == Tier::device, false);
    return;
  }
  std::uint64_t in_cpu = 0;
  for (std::size_t li = 0; li < shards_.size(); ++li) {
    const int i = static_cast<int>(li);
    // Layers under stage3_param_persistence_threshold stay gathered on the device; their
    // shards, refreshed from there after each step, stay in host RAM rather than on NVMe.
    Tier params = shards_.persistent(i) && par == Tier::nvme ? Tier::host : par;
    if (params == Tier::nvme && in_cpu + shard(i) <= c_.cfg.offload_param.max_in_cpu) {
      params = Tier::host;
      in_cpu += shard(i);
    }
    shards_.place(i, c_.layout.layers()[li].frozen ? Tier::device : opt, params);
  }

  const std::uint64_t minimum = check_device_fit(opt == Tier::device, stage == 3 && par == Tier::device);
  device_minimum_ = minimum;
  std::ostringstream out;
  std::array<int, kTiers> opt_n{}, par_n{};
  int frozen = 0;
  for (std::size_t li = 0; li < shards_.size(); ++li) {
    const int i = static_cast<int>(li);
    if (c_.layout.layers()[li].frozen)
      ++frozen;
    else
      ++opt_n[static_cast<int>(shards_.opt_tier(i))];
    ++par_n[static_cast<int>(shards_.param_tier(i))];
  }
  auto counts = [](const std::array<int, kTiers>& n) {
    std::string s;
    for (int t = 0; t < kTiers; ++t) {
      if (n[t] > 0) s += str_cat(s.empty() ? "" : ", ", n[t], " on ", tier_name(static_cast<Tier>(t)));
    }
    return s;
  };
  out << "placement (static, DeepSpeed keys), rank " << c_.rank << ", " << shards_.size() << " layers:\n";
  out << "  optimizer state (" << state_description(c_.cfg.optimizer) << "): " << counts(opt_n)
      << " (offload_optimizer.device; gradient accumulators follow: device with device state, else host)";
  if (frozen > 0) out << "; " << frozen << " frozen layers hold none";
  if (opt_n[static_cast<int>(Tier::nvme)] > 0) {
    const std::uint64_t spares = c_.cfg.offload_optimizer.spare_sub_groups;
    out << "; its NVMe files "
        << (spares == 0 ? std::string("in two generations (offload_optimizer.spare_sub_groups 0)")
                        : str_cat("once, plus ", spares, " spare files per sub-group length (spare_sub_groups)"));
  }
  out << "\n";
  out << "  parameters: " << (stage == 3 ? counts(par_n) : std::string("all on device (stages 0-2 replicate them)"));
  if (stage == 3 && par == Tier::nvme) {
    const std::uint64_t spares = c_.cfg.offload_param.spare_chunks;
    out << " (offload_param.device nvme, max_in_cpu " << c_.cfg.offload_param.max_in_cpu
        << " elements kept in host RAM; its NVMe files "
        << (spares == 0 ? std::string("in two generations (offload_param.spare_chunks 0)")
                        : str_cat("once, plus ", spares, " spare files per chunk length (spare_chunks)"))
        << ")";
  }
  out << "\n  device minimum " << format_bytes(minimum) << " of budget " << format_bytes(c_.device_budget);
  if (device_room() < c_.device_budget) {
    out << " (" << format_bytes(c_.device_budget - device_room()) << " of it held by the trainer)";
  }
  out << "\n";
  text_ = out.str() + frozen_note();
}

// What frozen layers do not hold: the optimizer state and accumulators they would as trainable ones.
std::string PlacementPlan::frozen_note() const {
  const int stage = c_.cfg.zero.stage;
  std::uint64_t elems = 0, opt = 0, acc = 0;
  int n = 0;
  for (std::size_t li = 0; li < shards_.size(); ++li) {
    const auto& L = c_.layout.layers()[li];
    if (!L.frozen) continue;
    ++n;
    elems += L.numel;
    opt += state_bytes(c_.cfg.optimizer, OptimizerState::elems(c_.layout, stage, static_cast<int>(li)));
    acc += 4 * GradReducer::acc_elems(c_.layout, stage, static_cast<int>(li));
  }
  if (n == 0) return {};
  return str_cat("  frozen layers: ", n, " (", elems,
                 " parameters, held in the compute dtype only); not allocated: ", format_bytes(opt),
                 " of optimizer state (", state_description(c_.cfg.optimizer), ") and up to ", format_bytes(acc),
                 " of gradient accumulators\n");
}

// Budget-driven placement assumed the host-trainer contract's gathers per layer; once the
// first trace is recorded (step() of step 1, before the optimizer runs), plan again with
// the recorded counts. Only parameter shards depend on them: when the new plan differs in
// parameter shards alone, they move to their new tiers now; a plan that would also move
// optimizer state is only reported (with how to get it: nothing carries it to a next run).
void PlacementPlan::replan(const std::vector<int>& gathers, std::int64_t step, const Migrate& migrate) {
  if (!budget_driven() || c_.cfg.zero.stage != 3 || checked_) return;
  checked_ = true;
  try {
    const auto problem = make_problem(gathers);
    const auto plan = offload::plan_placement(problem);
    bool same_opt = true, same_params = true;
    std::vector<Tier> to(shards_.size());
    for (std::size_t li = 0; li < shards_.size(); ++li) {
      const int i = static_cast<int>(li);
      same_opt = same_opt && plan.layers[li].optimizer == shards_.opt_tier(i);
      to[li] = plan.layers[li].params;
      if (shards_.persistent(i) && to[li] == Tier::nvme) to[li] = Tier::host;
      same_params = same_params && to[li] == shards_.param_tier(i);
    }
    if (same_opt && !same_params) {
      std::vector<int> stayed;
      std::vector<bool> moved(to.size(), true);  // made before the shards move: recording them cannot fail
      try {
        stayed = migrate(to);
      } catch (const Error& e) {  // nothing moved
        STRATA_LOG(warn, "rank ", c_.rank,
                   ": moving parameter shards to the placement the recorded trace favours failed; "
                   "the placement stays as it was: ",
                   e.what());
        return;
      }
      // The map records where the shards went: each to its new tier but those that stayed.
      for (int li : stayed) moved[static_cast<std::size_t>(li)] = false;
      for (std::size_t li = 0; li < to.size(); ++li) {
        if (moved[li]) shards_.move_params(static_cast<int>(li), to[li]);
      }
      std::string kept;
      for (int li : stayed) {
        kept += str_cat("  layer ", c_.layout.layers()[li].id, ": parameter shards stay on ",
                        tier_name(shards_.param_tier(li)), " (no room on ", tier_name(to[li]), ")\n");
      }
      text_ = str_cat("placement (budget-driven, memory_budget, re-placed after step ", step,
                      " from the recorded gather trace), rank ", c_.rank, ":\n", plan.explain(problem), kept);
      STRATA_LOG(info, "rank ", c_.rank, ": parameter shards re-placed from the recorded gather trace:\n",
                 plan.explain(problem));
    } else if (!same_opt) {
      STRATA_LOG(warn, "rank ", c_.rank,
                 ": the recorded gather trace differs from the host-trainer contract the placement "
                 "assumed (forward and backward of every micro-batch); with the recorded counts Strata would place:\n",
                 plan.explain(problem),
                 "This run keeps its placement (optimizer state does not move between tiers mid-run), and a "
                 "new run plans from the contract's counts again, not from this trace: to train with the "
                 "placement above, set offload_optimizer and offload_param to its tiers.");
    }
  } catch (const Error& e) {
    STRATA_LOG(warn, "rank ", c_.rank, ": re-planning with the recorded gather trace failed: ", e.what());
  }
}

// The device budget less what others (the trainer's activations) held on the Device when
// setup() began.
std::uint64_t PlacementPlan::device_room() const {
  const std::uint64_t budget = c_.device_budget;
  return budget > c_.device_held_by_others ? budget - c_.device_held_by_others : 0;
}

// What the placement leaves on the device, against its budget; returns the minimum.
std::uint64_t PlacementPlan::check_device_fit(bool opt_on_device, bool params_on_device) const {
  const int stage = c_.cfg.zero.stage;
  const Layout& lay = c_.layout;
  std::uint64_t persistent = 0, largest = lay.largest_layer_padded();
  for (std::size_t li = 0; li < shards_.size(); ++li) {
    const auto& L = lay.layers()[li];
    const int i = static_cast<int>(li);
    if (stage <= 2) persistent += L.padded * c_.cbytes;
    if (stage == 3 && shards_.param_tier(i) == Tier::device) persistent += shard(i) * c_.cbytes;
    if (shards_.persistent(i)) persistent += L.padded * c_.cbytes;
    if (shards_.opt_tier(i) == Tier::device && !L.frozen)
      persistent += GradReducer::acc_elems(lay, stage, static_cast<int>(li)) * 4 +
                    state_bytes(c_.cfg.optimizer, OptimizerState::elems(lay, stage, static_cast<int>(li))) -
                    muon_saving(i);
  }
  if (stage == 3) {
    STRATA_CHECK(c_.cfg.zero.stage3_max_live_parameters >= largest, Errc::invalid_argument,
                 "zero_optimization.stage3_max_live_parameters = ", c_.cfg.zero.stage3_max_live_parameters,
                 " is below the largest layer (", largest, " elements with padding): raise it to at least ", largest);
  }
  // The gathered layers the trainer holds at once (one, or a pipeline action's chunk) and a
  // gradient buffer.
  const auto at_once = static_cast<std::uint64_t>(std::max(1, c_.layers_at_once));
  // Each buffer as the device rounds it (what the ledger charges).
  const std::uint64_t window = device::Arena::round_up(largest * c_.cbytes) * (at_once + 1);
  const std::uint64_t minimum = persistent + window + device_scratch_bytes();
  const std::uint64_t budget = device_room();
  const std::uint64_t held = c_.device_budget - budget;
  STRATA_CHECK(
      minimum <= budget, Errc::out_of_budget, "device budget ", format_bytes(budget),
      held ? str_cat(" (", format_bytes(c_.device_budget), " less ", format_bytes(held),
                     " the trainer holds or reserves on the device)")
           : std::string(),
      " is too small for ZeRO stage ", stage, " of this model on rank ", c_.rank, ": it needs at least ",
      format_bytes(minimum), " (", minimum, " B: ", format_bytes(persistent), " of persistent shards and state + ",
      format_bytes(window), " for the live window of the largest layer, ", largest, " elements",
      at_once > 1 ? str_cat(", ", at_once, " of them gathered at once") : std::string(),
      device_scratch_bytes() ? str_cat(" + ", format_bytes(device_scratch_bytes()), " of device reduction scratch")
                             : std::string(),
      "). Raise the device budget",
      held ? str_cat(" to at least ", format_bytes(minimum + held), " (", minimum + held,
                     " B) with what the trainer holds")
           : std::string(),
      stage < 3 ? ", use a higher ZeRO stage" : "", opt_on_device ? " or offload the optimizer to the CPU" : "",
      params_on_device ? " or offload the parameters (offload_param)" : "");
  return minimum;
}

// What the placement puts in host RAM (and, on the host-emulated device, what the device
// will hold, which is host RAM too) against what the machine has left, before any of it is
// allocated: a run that cannot fit is refused naming the bytes and the keys to change,
// instead of swapping the machine to a halt or meeting the OOM killer mid-setup.
PlacementPlan::HostParts PlacementPlan::host_parts() const {
  HostParts h;
  for (std::size_t li = 0; li < shards_.size(); ++li) {
    const int i = static_cast<int>(li);
    if (shards_.opt_tier(i) == Tier::host)
      h.opt += state_bytes(c_.cfg.optimizer, OptimizerState::elems(c_.layout, c_.cfg.zero.stage, i)) - muon_saving(i);
    if (shards_.acc_on_host(i)) h.acc += GradReducer::acc_elems(c_.layout, c_.cfg.zero.stage, i) * host_acc_bytes();
    if (c_.cfg.zero.stage == 3 && shards_.param_tier(i) == Tier::host) h.params += shard(i) * c_.cbytes;
    if (shards_.opt_tier(i) == Tier::nvme && muon_scan(i))
      h.muon += 4 * OptimizerState::elems(c_.layout, c_.cfg.zero.stage, i);
  }
  h.reducer = GradReducer::host_scratch_bytes(c_.layout, c_.cbytes, shards_.any_acc_on_host());
  h.muon += muon_scratch();  // in host_fixed_bytes for the placement; here a part of its own
  h.fixed = make_problem({}).host_fixed_bytes - GradReducer::host_scratch_bytes(c_.layout, c_.cbytes, true) +
            h.reducer - muon_scratch();
  if (shards_.any_opt_on(Tier::nvme))
    h.swap_min = offload::OptimizerSwapper::min_budget_bytes(OptimizerState::swapper_options(c_.cfg, 0),
                                                             OptimizerState::swap_tensors(c_.layout, shards_));
  if (shards_.any_params_on(Tier::nvme))
    h.param_min =
        offload::ParamStore::min_budget_bytes(NvmeHomes::param_options(c_.cfg, c_.cbytes, 0),
                                              NvmeHomes::param_tensors(c_.layout, c_.cbytes, shards_.param_tiers()));
  return h;
}

void PlacementPlan::check_host_budget() const {
  const std::uint64_t budget = c_.cfg.memory_budget.host;
  if (budget == 0) return;
  const HostParts h = host_parts();
  // The fix first (under 200 characters), the parts after.
  STRATA_CHECK(h.total() <= budget, Errc::out_of_budget, "host tier: raise memory_budget.host to at least ", h.total(),
               " B (", format_bytes(h.total()), "; it is ", format_bytes(budget),
               "), or place less in host RAM (offload_optimizer.device / offload_param.device \"nvme\"). Why: the "
               "placement needs ",
               format_bytes(h.opt), " optimizer state, ", format_bytes(h.acc), " gradient accumulators, ",
               h.muon ? str_cat(format_bytes(h.muon), " of Muon's gathers and orthogonalized updates, ") : "",
               format_bytes(h.params), " parameter shards, ", format_bytes(h.fixed),
               " of reduction scratch and staging (the largest bucket and layer: zero_optimization.reduce_bucket_size "
               "bounds the first) and ",
               format_bytes(h.swap_min + h.param_min), " for one NVMe swap buffer per store there");
}

void PlacementPlan::check_host_fit() const {
  const bool on_nvme = shards_.any_opt_on(Tier::nvme) || shards_.any_params_on(Tier::nvme);
  const HostParts h = host_parts();
  const std::uint64_t opt = h.opt, acc = h.acc, params = h.params;
  const offload::PlacementProblem p = make_problem({});
  const std::uint64_t buffers = p.host_fixed_bytes + (on_nvme ? p.nvme_buffer_bytes : 0);
  const bool emulated = c_.device_in_host_ram;
  const std::uint64_t device = emulated ? check_device_fit(false, false) : 0;
  const std::uint64_t need = opt + acc + params + buffers + device;
  const HostMemory have = host_memory_available();
  // Ranks on one host share its RAM: count them (by host name), and decide together, so
  // that no rank is left waiting in a collective for one that refused.
  int local = 1;
  bool other_refused = false;
  bool fits = need <= have.available;
  if (c_.comm != nullptr && c_.world > 1) {
    const std::uint64_t mine = std::hash<std::string>{}(host_name());
    std::vector<std::uint64_t> hosts(c_.world);
    c_.comm->all_gather(&mine, hosts.data(), 2, DType::fp32);  // 8 bytes carried as two fp32 words
    local = static_cast<int>(std::count(hosts.begin(), hosts.end(), mine));
    fits = need <= have.available / static_cast<std::uint64_t>(local);
    float refused = fits ? 0.0f : 1.0f;
    c_.comm->all_reduce(&refused, 1, DType::fp32, comm::ReduceOp::max);
    other_refused = fits && refused > 0.0f;
  }
  STRATA_CHECK(!other_refused, Errc::out_of_budget, "rank ", c_.rank,
               ": another rank refused this placement for lack of host memory (see its error)");
  STRATA_CHECK(
      fits, Errc::out_of_budget, "rank ", c_.rank, ": host memory: this placement needs ", format_bytes(need),
      " of host RAM per rank (", format_bytes(opt), " optimizer state, ", format_bytes(acc), " gradient accumulators, ",
      format_bytes(params), " parameter shards, ", format_bytes(buffers), " of buffers",
      emulated ? str_cat(", ", format_bytes(device), " for the host-emulated device") : std::string(), ")",
      local > 1 ? str_cat(", ", format_bytes(need * static_cast<std::uint64_t>(local)), " for the ", local,
                          " ranks on this host,")
                : std::string(),
      " but only ", format_bytes(have.available), " is available (", have.source,
      "). Move optimizer state to NVMe (offload_optimizer.device = \"nvme\" with nvme_path)",
      c_.cfg.zero.stage == 3 ? ", parameters too (offload_param.device = \"nvme\")" : ", use ZeRO stage 3",
      ", set memory_budget.host below what the machine has (the planner then puts the rest on NVMe), or train a "
      "smaller model");
}

}  // namespace strata::engine
