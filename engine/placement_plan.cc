// Placement: which tier holds each layer's optimizer state (and with it the fp32 gradient
// accumulator: on the device with device optimizer state, in host RAM otherwise) and, at
// stage 3, its parameter shards. The static form follows DeepSpeed: offload_optimizer.device
// and offload_param.device for every layer, with offload_param.max_in_cpu elements of NVMe
// parameter shards kept in host RAM instead (layers in order). With memory_budget set, the
// kinds whose offload device is left at "none" are placed by the budget-driven planner
// (offload/placement.h): per layer, the tiers that move the fewest bytes per step within
// the budgets, assuming the host-trainer contract's gathers (forward and backward of every
// micro-batch); the first recorded trace is checked against that assumption. A model that
// fits no placement is refused here, naming the smallest budget that would fit. Before
// anything is allocated the device budget is checked against what the placement leaves
// there, naming the minimum.
#include <algorithm>
#include <cstring>
#include <functional>
#include <sstream>

#include "engine/detail/engine_impl.h"
#include "offload/placement.h"
#include "runtime/comm/communicator.h"
#include "runtime/core/error.h"
#include "runtime/core/host_memory.h"
#include "runtime/core/log.h"
#include "runtime/core/units.h"

namespace strata::engine {
namespace {

Tier tier_of(OffloadDevice d) {
  return d == OffloadDevice::cpu ? Tier::host : d == OffloadDevice::nvme ? Tier::nvme : Tier::device;
}

}  // namespace

bool Engine::Impl::budget_driven() const {
  const auto& b = cfg.memory_budget;
  return (b.device || b.host || b.nvme) && (cfg.offload_optimizer.device == OffloadDevice::none ||
                                            (cfg.zero.stage == 3 && cfg.offload_param.device == OffloadDevice::none));
}

offload::PlacementProblem Engine::Impl::placement_problem(const std::vector<int>& gathers) const {
  const int stage = cfg.zero.stage;
  const Layout& lay = *layout;
  offload::PlacementProblem p;
  p.stage = stage;
  p.compute_bytes = static_cast<std::uint32_t>(cbytes);
  p.accumulation_steps = static_cast<int>(std::max<std::int64_t>(1, cfg.gradient_accumulation_steps));
  std::uint64_t persistent = 0, max_bucket = 0, max_shard = 0, largest_shard = 0;
  for (std::size_t li = 0; li < layers.size(); ++li) {
    const auto& L = lay.layers()[li];
    const auto& S = layers[li];
    offload::PlacementLayer pl;
    pl.name = str_cat("layer ", L.id);
    pl.shard_elems = stage == 0 ? L.padded : S.shard_total;
    pl.padded_elems = L.padded;
    pl.gathers_per_step = gathers.empty() ? 2 * p.accumulation_steps : gathers[li];
    p.layers.push_back(pl);
    if (S.persistent) persistent += L.padded * cbytes;
    largest_shard = std::max<std::uint64_t>(largest_shard, S.shard_total);
  }
  for (const auto& b : lay.buckets()) {
    max_bucket = std::max<std::uint64_t>(max_bucket, b.padded);
    max_shard = std::max<std::uint64_t>(max_shard, b.shard);
  }
  const std::uint64_t largest = lay.largest_layer_padded();
  p.device_budget = device_room();
  p.host_budget = cfg.memory_budget.host ? cfg.memory_budget.host : ~std::uint64_t{0};
  p.nvme_budget = cfg.memory_budget.nvme;
  p.nvme_copies = 2;  // swap files hold two generations
  p.device_gathers = device_collectives();
  p.nvme_available = !cfg.offload_optimizer.nvme_path.empty() || !cfg.offload_param.nvme_path.empty();
  // Live window + persistent layers (+ the device reduction scratch with device collectives).
  p.device_fixed_bytes = largest * cbytes * 2 + persistent + device_scratch_bytes();
  // Reduction scratch, gradient staging, one gather's staging, one layer's updated shards.
  p.host_fixed_bytes =
      (max_bucket + max_shard) * 4 + max_bucket * cbytes + (stage == 3 ? largest * cbytes : 0) + largest_shard * cbytes;
  const int opt_buffers = cfg.offload_optimizer.buffer_count > 0 ? cfg.offload_optimizer.buffer_count : 4;
  const std::uint64_t sub_group =
      std::min<std::uint64_t>(cfg.zero.sub_group_size, std::max<std::uint64_t>(1, largest_shard));
  p.nvme_buffer_bytes = static_cast<std::uint64_t>(opt_buffers) * ((sub_group * 12 + 4095) / 4096 * 4096);
  if (stage == 3) {
    const int par_buffers = cfg.offload_param.buffer_count > 0 ? cfg.offload_param.buffer_count : 5;
    const std::uint64_t chunk = std::min<std::uint64_t>(cfg.offload_param.buffer_size, largest_shard) * cbytes;
    p.nvme_buffer_bytes += static_cast<std::uint64_t>(par_buffers) * ((chunk + 4095) / 4096 * 4096);
  }
  if (cfg.offload_optimizer.device != OffloadDevice::none) p.optimizer_fixed = tier_of(cfg.offload_optimizer.device);
  if (stage < 3)
    p.params_fixed = offload::Tier::device;
  else if (cfg.offload_param.device != OffloadDevice::none)
    p.params_fixed = tier_of(cfg.offload_param.device);
  return p;
}

void Engine::Impl::place_layers() {
  const int stage = cfg.zero.stage;
  const Tier opt = tier_of(cfg.offload_optimizer.device);
  const Tier par = stage == 3 ? tier_of(cfg.offload_param.device) : Tier::device;
  if (budget_driven()) {
    const offload::PlacementProblem problem = placement_problem({});
    const offload::Placement plan = offload::plan_placement(problem);  // refuses, naming the budget to raise
    for (std::size_t li = 0; li < layers.size(); ++li) {
      auto& S = layers[li];
      S.opt_tier = plan.layers[li].optimizer;
      S.param_tier = plan.layers[li].params;
      if (S.persistent && S.param_tier == Tier::nvme) S.param_tier = Tier::host;
    }
    placement_text = str_cat("placement (budget-driven, memory_budget), rank ", rank, ":\n", plan.explain(problem));
    check_device_fit(opt == Tier::device, false);
    return;
  }
  std::uint64_t in_cpu = 0;
  for (std::size_t li = 0; li < layers.size(); ++li) {
    auto& S = layers[li];
    S.opt_tier = opt;
    // Layers under stage3_param_persistence_threshold stay gathered on the device; their
    // shards, refreshed from there after each step, stay in host RAM rather than on NVMe.
    S.param_tier = S.persistent && par == Tier::nvme ? Tier::host : par;
    if (S.param_tier == Tier::nvme && in_cpu + S.shard_total <= cfg.offload_param.max_in_cpu) {
      S.param_tier = Tier::host;
      in_cpu += S.shard_total;
    }
  }

  const std::uint64_t minimum = check_device_fit(opt == Tier::device, stage == 3 && par == Tier::device);
  std::ostringstream out;
  std::array<int, kTiers> opt_n{}, par_n{};
  for (const auto& S : layers) {
    ++opt_n[static_cast<int>(S.opt_tier)];
    ++par_n[static_cast<int>(S.param_tier)];
  }
  auto counts = [](const std::array<int, kTiers>& n) {
    std::string s;
    for (int t = 0; t < kTiers; ++t) {
      if (n[t] > 0) s += str_cat(s.empty() ? "" : ", ", n[t], " on ", tier_name(static_cast<Tier>(t)));
    }
    return s;
  };
  out << "placement (static, DeepSpeed keys), rank " << rank << ", " << layers.size() << " layers:\n";
  out << "  optimizer state (fp32 master, exp_avg, exp_avg_sq): " << counts(opt_n)
      << " (offload_optimizer.device; gradient accumulators follow: device with device state, else host)\n";
  out << "  parameters: " << (stage == 3 ? counts(par_n) : std::string("all on device (stages 0-2 replicate them)"));
  if (stage == 3 && par == Tier::nvme)
    out << " (offload_param.device nvme, max_in_cpu " << cfg.offload_param.max_in_cpu << " elements kept in host RAM)";
  out << "\n  device minimum " << format_bytes(minimum) << " of budget " << format_bytes(dev.options().budget_bytes);
  if (device_room() < dev.options().budget_bytes) {
    out << " (" << format_bytes(dev.options().budget_bytes - device_room()) << " of it held by the trainer)";
  }
  out << "\n";
  placement_text = out.str();
}

// Budget-driven placement assumed the host-trainer contract's gathers per layer; once the
// first trace is recorded (step() of step 1, before the optimizer runs), plan again with
// the recorded counts. Only parameter shards depend on them: when the new plan differs in
// parameter shards alone, they move to their new tiers now; a plan that would also move
// optimizer state is reported and applies at the next start.
void Engine::Impl::check_plan_against_trace() {
  if (!budget_driven() || cfg.zero.stage != 3 || plan_checked) return;
  plan_checked = true;
  std::vector<int> gathers(layers.size(), 0);
  for (int li : gather_path->trace().trace()) ++gathers[static_cast<std::size_t>(li)];
  try {
    const auto problem = placement_problem(gathers);
    const auto plan = offload::plan_placement(problem);
    bool same_opt = true, same_params = true;
    std::vector<Tier> to(layers.size());
    for (std::size_t li = 0; li < layers.size(); ++li) {
      same_opt = same_opt && plan.layers[li].optimizer == layers[li].opt_tier;
      to[li] = plan.layers[li].params;
      if (layers[li].persistent && to[li] == Tier::nvme) to[li] = Tier::host;
      same_params = same_params && to[li] == layers[li].param_tier;
    }
    if (same_opt && !same_params) {
      std::vector<int> stayed;
      // The plan follows the shards wherever the migration left them.
      auto follow_homes = [this] {
        for (std::size_t li = 0; li < layers.size(); ++li) layers[li].param_tier = homes->tier(static_cast<int>(li));
      };
      try {
        gather_path->synchronize();
        stayed = homes->migrate(to);
        follow_homes();
      } catch (const Error& e) {
        follow_homes();
        STRATA_LOG(warn, "rank ", rank,
                   ": moving parameter shards to the placement the recorded trace favours failed; "
                   "the placement stays as it was: ",
                   e.what());
        return;
      }
      std::string kept;
      for (int li : stayed) {
        kept += str_cat("  layer ", layout->layers()[li].id, ": parameter shards stay on ",
                        tier_name(layers[li].param_tier), " (no room on ", tier_name(to[li]), ")\n");
      }
      placement_text = str_cat("placement (budget-driven, memory_budget, re-placed after step ", step_calls + 1,
                               " from the recorded gather trace), rank ", rank, ":\n", plan.explain(problem), kept);
      STRATA_LOG(info, "rank ", rank, ": parameter shards re-placed from the recorded gather trace:\n",
                 plan.explain(problem));
    } else if (!same_opt) {
      STRATA_LOG(warn, "rank ", rank,
                 ": the recorded gather trace differs from the host-trainer contract the placement "
                 "assumed (forward and backward of every micro-batch); with the recorded counts Strata would place:\n",
                 plan.explain(problem),
                 "This run keeps its placement; the new one applies when training starts again.");
    }
  } catch (const Error& e) {
    STRATA_LOG(warn, "rank ", rank, ": re-planning with the recorded gather trace failed: ", e.what());
  }
}

// The device budget less what others (the trainer's activations) held on the Device when
// setup() began.
std::uint64_t Engine::Impl::device_room() const {
  const std::uint64_t budget = dev.options().budget_bytes;
  return budget > device_held_by_others ? budget - device_held_by_others : 0;
}

// What the placement leaves on the device, against its budget; returns the minimum.
std::uint64_t Engine::Impl::check_device_fit(bool opt_on_device, bool params_on_device) const {
  const int stage = cfg.zero.stage;
  const Layout& lay = *layout;
  std::uint64_t persistent = 0, largest = lay.largest_layer_padded();
  for (std::size_t li = 0; li < layers.size(); ++li) {
    const auto& L = lay.layers()[li];
    const auto& S = layers[li];
    if (stage <= 2) persistent += L.padded * cbytes;
    if (stage == 3 && S.param_tier == Tier::device) persistent += S.shard_total * cbytes;
    if (S.persistent) persistent += L.padded * cbytes;
    if (S.opt_tier == Tier::device)
      persistent += (stage <= 1 ? L.padded : S.shard_total) * 4 + (stage == 0 ? L.padded : S.shard_total) * 12;
  }
  if (stage == 3) {
    STRATA_CHECK(cfg.zero.stage3_max_live_parameters >= largest, Errc::invalid_argument,
                 "zero_optimization.stage3_max_live_parameters = ", cfg.zero.stage3_max_live_parameters,
                 " is below the largest layer (", largest, " elements with padding): raise it to at least ", largest);
  }
  const std::uint64_t window = largest * cbytes * 2;  // one gathered layer and its gradient buffer
  const std::uint64_t minimum = persistent + window + device_scratch_bytes();
  const std::uint64_t budget = device_room();
  const std::uint64_t held = dev.options().budget_bytes - budget;
  STRATA_CHECK(
      minimum <= budget, Errc::out_of_budget, "device budget ", format_bytes(budget),
      held ? str_cat(" (", format_bytes(dev.options().budget_bytes), " less ", format_bytes(held),
                     " the trainer holds on the device)")
           : std::string(),
      " is too small for ZeRO stage ", stage, " of this model on rank ", rank, ": it needs at least ",
      format_bytes(minimum), " (", minimum, " B: ", format_bytes(persistent), " of persistent shards and state + ",
      format_bytes(window), " for the live window of the largest layer, ", largest, " elements",
      device_scratch_bytes() ? str_cat(" + ", format_bytes(device_scratch_bytes()), " of device reduction scratch")
                             : std::string(),
      "). Raise the device budget", stage < 3 ? ", use a higher ZeRO stage" : "",
      opt_on_device ? " or offload the optimizer to the CPU" : "",
      params_on_device ? " or offload the parameters (offload_param)" : "");
  return minimum;
}

// What the placement puts in host RAM (and, on the host-emulated device, what the device
// will hold, which is host RAM too) against what the machine has left, before any of it is
// allocated: a run that cannot fit is refused naming the bytes and the keys to change,
// instead of swapping the machine to a halt or meeting the OOM killer mid-setup.
void Engine::Impl::check_host_fit() const {
  std::uint64_t opt = 0, acc = 0, params = 0;
  bool on_nvme = false;
  for (std::size_t li = 0; li < layers.size(); ++li) {
    const auto& S = layers[li];
    const int i = static_cast<int>(li);
    on_nvme = on_nvme || S.opt_tier == Tier::nvme || S.param_tier == Tier::nvme;
    if (S.opt_tier == Tier::host) opt += opt_elems(i) * 12;
    if (acc_on_host(i)) acc += (cfg.zero.stage <= 1 ? padded_elems(i) : S.shard_total) * 4;
    if (cfg.zero.stage == 3 && S.param_tier == Tier::host) params += S.shard_total * cbytes;
  }
  const offload::PlacementProblem p = placement_problem({});
  const std::uint64_t buffers = p.host_fixed_bytes + (on_nvme ? p.nvme_buffer_bytes : 0);
  const bool emulated = dev.backend() == device::Backend::host;
  const std::uint64_t device = emulated ? check_device_fit(false, false) : 0;
  const std::uint64_t need = opt + acc + params + buffers + device;
  const HostMemory have = host_memory_available();
  // Ranks on one host share its RAM: count them (by host name), and decide together, so
  // that no rank is left waiting in a collective for one that refused.
  int local = 1;
  bool other_refused = false;
  bool fits = need <= have.available;
  if (comm != nullptr && world > 1) {
    const std::uint64_t mine = std::hash<std::string>{}(host_name());
    std::vector<std::uint64_t> hosts(world);
    comm->all_gather(&mine, hosts.data(), 2, DType::fp32);  // 8 bytes carried as two fp32 words
    local = static_cast<int>(std::count(hosts.begin(), hosts.end(), mine));
    fits = need <= have.available / static_cast<std::uint64_t>(local);
    float refused = fits ? 0.0f : 1.0f;
    comm->all_reduce(&refused, 1, DType::fp32, comm::ReduceOp::max);
    other_refused = fits && refused > 0.0f;
  }
  STRATA_CHECK(!other_refused, Errc::out_of_budget, "rank ", rank,
               ": another rank refused this placement for lack of host memory (see its error)");
  STRATA_CHECK(
      fits, Errc::out_of_budget, "rank ", rank, ": host memory: this placement needs ", format_bytes(need),
      " of host RAM per rank (", format_bytes(opt), " optimizer state, ", format_bytes(acc), " gradient accumulators, ",
      format_bytes(params), " parameter shards, ", format_bytes(buffers), " of buffers",
      emulated ? str_cat(", ", format_bytes(device), " for the host-emulated device") : std::string(), ")",
      local > 1 ? str_cat(", ", format_bytes(need * static_cast<std::uint64_t>(local)), " for the ", local,
                          " ranks on this host,")
                : std::string(),
      " but only ", format_bytes(have.available), " is available (", have.source,
      "). Move optimizer state to NVMe (offload_optimizer.device = \"nvme\" with nvme_path)",
      cfg.zero.stage == 3 ? ", parameters too (offload_param.device = \"nvme\")" : ", use ZeRO stage 3",
      ", set memory_budget.host below what the machine has (the planner then puts the rest on NVMe), or train a "
      "smaller model");
}

}  // namespace strata::engine
