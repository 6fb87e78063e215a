// Placement: which tier holds each layer's optimizer state (and with it the fp32 gradient
// accumulator: on the device with device optimizer state, in host RAM otherwise) and, at
// stage 3, its parameter shards. The static form follows DeepSpeed: offload_optimizer.device
// and offload_param.device for every layer, with offload_param.max_in_cpu elements of NVMe
// parameter shards kept in host RAM instead (layers in order). Before anything is allocated
// the device budget is checked against what the placement leaves there, naming the minimum.
#include <algorithm>
#include <sstream>

#include "engine/core/error.h"
#include "engine/core/units.h"
#include "engine/zero/detail/engine_impl.h"

namespace strata::zero {
namespace {

Tier tier_of(OffloadDevice d) {
  return d == OffloadDevice::cpu ? Tier::host : d == OffloadDevice::nvme ? Tier::nvme : Tier::device;
}

}  // namespace

void Engine::Impl::place_layers() {
  const int stage = cfg.zero.stage;
  const Layout& lay = *layout;
  const Tier opt = tier_of(cfg.offload_optimizer.device);
  const Tier par = stage == 3 ? tier_of(cfg.offload_param.device) : Tier::device;
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

  // What the placement leaves on the device, against its budget.
  std::uint64_t persistent = 0, largest = lay.largest_layer_padded();
  for (std::size_t li = 0; li < layers.size(); ++li) {
    const auto& L = lay.layers()[li];
    const auto& S = layers[li];
    if (stage <= 2) persistent += L.padded * cbytes;
    if (stage == 3 && S.param_tier == Tier::device) persistent += S.shard_total * cbytes;
    if (S.persistent) persistent += L.padded * cbytes;
    if (S.opt_tier == Tier::device) persistent += (stage <= 1 ? L.padded : S.shard_total) * 4 +
                                                  (stage == 0 ? L.padded : S.shard_total) * 12;
  }
  if (stage == 3) {
    STRATA_CHECK(cfg.zero.stage3_max_live_parameters >= largest, Errc::invalid_argument,
                 "zero_optimization.stage3_max_live_parameters = ", cfg.zero.stage3_max_live_parameters,
                 " is below the largest layer (", largest, " elements with padding): raise it to at least ", largest);
  }
  const std::uint64_t window = largest * cbytes * 2;  // one gathered layer and its gradient buffer
  const std::uint64_t minimum = persistent + window;
  const std::uint64_t budget = dev.options().budget_bytes;
  const bool opt_on_device = opt == Tier::device;
  STRATA_CHECK(minimum <= budget, Errc::out_of_budget, "device budget ", format_bytes(budget), " is too small for ZeRO stage ",
               stage, " of this model on rank ", rank, ": it needs at least ", format_bytes(minimum), " (", minimum,
               " B: ", format_bytes(persistent), " of persistent shards and state + ", format_bytes(window),
               " for the live window of the largest layer, ", largest, " elements). Raise the device budget",
               stage < 3 ? ", use a higher ZeRO stage" : "", opt_on_device ? " or offload the optimizer to the CPU" : "",
               stage == 3 && par == Tier::device ? " or offload the parameters (offload_param)" : "");

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
  if (stage == 3 && par == Tier::nvme) out << " (offload_param.device nvme, max_in_cpu " << cfg.offload_param.max_in_cpu << " elements kept in host RAM)";
  out << "\n  device minimum " << format_bytes(minimum) << " of budget " << format_bytes(budget) << "\n";
  placement_text = out.str();
}

}  // namespace strata::zero
