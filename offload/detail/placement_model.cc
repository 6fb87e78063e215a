// The placement problem in item form (see placement_model.h): validation, the cost model
// of placement.h turned into per-item bytes and flows, and the incremental tier accounting.
#include "offload/detail/placement_model.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "runtime/core/error.h"

namespace strata::offload::detail {
namespace {

// Bytes of the optimizer state of `elems` elements (exact: see PlacementProblem::state_bytes).
std::uint64_t state_of(const PlacementProblem& p, std::uint64_t elems) {
  return static_cast<std::uint64_t>(std::llround(p.state_bytes * static_cast<double>(elems)));
}

// acc_elems: the accumulator's elements (4 bytes each on the device, host_accumulator_bytes on the host).
Item make_optimizer(const PlacementProblem& p, std::size_t layer, std::uint64_t acc_elems) {
  const auto& L = p.layers[layer];
  const std::uint64_t E = L.shard_elems, P = L.padded_elems, c = p.compute_bytes;
  const std::uint64_t A = static_cast<std::uint64_t>(p.accumulation_steps);
  const std::uint64_t host_acc = acc_elems * p.host_accumulator_bytes;
  Item it;
  it.layer = layer;
  it.optimizer = true;
  const std::uint64_t SE = state_of(p, E), RE = SE - std::min(SE, L.resident_saving);  // RE: in memory
  it.bytes[kDevice][kDevice] = RE + 4 * acc_elems;
  it.bytes[kHost][kHost] = RE + host_acc;
  it.bytes[kNvme][kHost] = host_acc;
  it.bytes[kNvme][kNvme] = SE * p.nvme_state_copies;
  it.flow[kHost] = {c * E, A * P * c, 0, 0};
  it.flow[kNvme] = {c * E, A * P * c, SE, SE};
  if (L.nvme_scan) {  // exp_avg read again a step; the scan's result held in host RAM until the step
    it.bytes[kNvme][kHost] += 4 * E;
    it.flow[kNvme][kNvmeRead] += (SE - 4 * E) / 2;
  }
  return it;
}

Item make_params(const PlacementProblem& p, std::size_t layer) {
  const auto& L = p.layers[layer];
  const std::uint64_t E = L.shard_elems, P = L.padded_elems, c = p.compute_bytes;
  const std::uint64_t G = static_cast<std::uint64_t>(L.gathers_per_step);
  const std::uint64_t W = L.frozen ? 0 : c * E;  // the step's write-back of updated shards (none when frozen)
  Item it;
  it.layer = layer;
  for (int t = 0; t < 3; ++t) it.bytes[t][t] = c * E * (t == kNvme ? p.nvme_copies : 1);
  if (p.device_gathers) {  // only the shard crosses the link; the layer is all-gathered on the device
    it.flow[kDevice] = {0, 0, 0, 0};
    it.flow[kHost] = {G * c * E, 0, 0, 0};
    it.flow[kNvme] = {G * c * E, 0, G * c * E, W};
    return it;
  }
  it.flow[kDevice] = {G * c * P, G * c * E, 0, 0};
  it.flow[kHost] = {G * c * P, 0, 0, 0};
  it.flow[kNvme] = {G * c * P, 0, G * c * E, W};
  return it;
}

}  // namespace

const char* config_value(Tier p) { return p == Tier::device ? "none" : p == Tier::host ? "cpu" : "nvme"; }

Model build_model(const PlacementProblem& p) {
  STRATA_CHECK(p.stage >= 0 && p.stage <= 3, Errc::invalid_argument, "placement: zero_optimization.stage = ", p.stage,
               " is not a ZeRO stage: use 0, 1, 2 or 3");
  STRATA_CHECK(
      p.compute_bytes > 0, Errc::invalid_argument,
      "placement: compute_bytes = 0: give the bytes per element of the compute dtype (2 for bf16/fp16, 4 for fp32)");
  STRATA_CHECK(p.state_bytes >= 4, Errc::invalid_argument, "placement: state_bytes = ", p.state_bytes,
               ": give the optimizer state's bytes per element (12 for fp32 moments, 8 for bf16 ones, 6.125 for q8)");
  STRATA_CHECK(p.host_accumulator_bytes == 2 || p.host_accumulator_bytes == 4, Errc::invalid_argument,
               "placement: host_accumulator_bytes = ", p.host_accumulator_bytes, ": use 4 (fp32) or 2 (bf16/fp16)");
  STRATA_CHECK(p.accumulation_steps >= 1, Errc::invalid_argument,
               "placement: gradient_accumulation_steps = ", p.accumulation_steps, ": use 1 or more");
  if (p.optimizer_fixed && *p.optimizer_fixed != Tier::device && p.stage == 0) {
    STRATA_THROW(Errc::invalid_argument, "offload_optimizer.device = \"", config_value(*p.optimizer_fixed),
                 "\" needs zero_optimization.stage >= 1: at stage 0 the optimizer state stays on the device");
  }
  if (p.params_fixed && *p.params_fixed != Tier::device && p.stage < 3) {
    STRATA_THROW(Errc::invalid_argument, "offload_param.device = \"", config_value(*p.params_fixed),
                 "\" needs zero_optimization.stage = 3 (it is ", p.stage,
                 "): below stage 3 parameters stay on the device");
  }
  STRATA_CHECK(!(p.optimizer_fixed == Tier::nvme && !p.nvme_available), Errc::invalid_argument,
               "offload_optimizer.device = \"nvme\" needs offload_optimizer.nvme_path");
  STRATA_CHECK(!(p.params_fixed == Tier::nvme && !p.nvme_available), Errc::invalid_argument,
               "offload_param.device = \"nvme\" needs offload_param.nvme_path");
  Model m;
  m.device_gathers = p.device_gathers;
  const std::uint64_t c = p.compute_bytes;
  m.opt_item.assign(p.layers.size(), -1);
  m.param_item.assign(p.layers.size(), -1);
  const std::uint8_t free_places = p.nvme_available ? 0b111 : 0b011;
  for (std::size_t i = 0; i < p.layers.size(); ++i) {
    const auto& L = p.layers[i];
    STRATA_CHECK(L.shard_elems <= L.padded_elems, Errc::invalid_argument, "placement: ", L.name, ": shard of ",
                 L.shard_elems, " elements is larger than the padded layer (", L.padded_elems, ")");
    STRATA_CHECK(p.stage > 0 || L.shard_elems == L.padded_elems, Errc::invalid_argument, "placement: ", L.name,
                 ": at ZeRO stage 0 the shard is the whole padded layer (", L.padded_elems, " elements), not ",
                 L.shard_elems);
    STRATA_CHECK(L.gathers_per_step >= 0, Errc::invalid_argument, "placement: ", L.name,
                 ": gathers_per_step = ", L.gathers_per_step);
    const std::uint64_t E = L.shard_elems, P = L.padded_elems;
    if (L.frozen) {
      // No optimizer item: a frozen layer has no master, moments, accumulator or gradient flow.
    } else if (p.stage == 0) {
      m.immovable[kDevice] += state_of(p, P) - std::min(state_of(p, P), L.resident_saving) + 4 * P;
    } else {
      Item it = make_optimizer(p, i, p.stage >= 2 ? E : P);
      it.fixed = p.optimizer_fixed.has_value();
      it.allowed = it.fixed ? static_cast<std::uint8_t>(1u << static_cast<int>(*p.optimizer_fixed)) : free_places;
      m.opt_item[i] = static_cast<int>(m.items.size());
      m.items.push_back(it);
    }
    if (p.stage < 3) {
      m.immovable[kDevice] += c * P;
    } else {
      Item it = make_params(p, i);
      it.fixed = p.params_fixed.has_value();
      it.allowed = it.fixed ? static_cast<std::uint8_t>(1u << static_cast<int>(*p.params_fixed)) : free_places;
      m.param_item[i] = static_cast<int>(m.items.size());
      m.items.push_back(it);
    }
  }
  for (auto& it : m.items) {
    for (int q = 0; q < 3; ++q) it.moved[q] = std::accumulate(it.flow[q].begin(), it.flow[q].end(), std::uint64_t{0});
  }
  m.base = m.immovable;
  m.base[kDevice] += p.device_fixed_bytes;
  m.base[kHost] += p.host_fixed_bytes;
  m.cap = {p.device_budget, p.host_budget, !p.nvme_available ? 0 : p.nvme_budget == 0 ? kUnlimited : p.nvme_budget};
  m.buffer = p.nvme_buffer_bytes;
  m.spare = {p.nvme_param_spare_bytes, p.nvme_state_spare_bytes};
  return m;
}

State empty_state(const Model& m) {
  State s;
  s.place.assign(m.items.size(), -1);
  s.used = m.base;
  return s;
}

bool fits(const Model& m, const State& s, std::size_t item, int place) {
  const Item& it = m.items[item];
  if (!it.can(place)) return false;
  for (int t = 0; t < 3; ++t) {
    std::uint64_t need = sat_add(s.used[t], it.bytes[place][t]);
    if (t == kHost && place == kNvme && s.on_nvme == 0) need = sat_add(need, m.buffer);
    if (t == kNvme && place == kNvme && s.on_nvme_of[it.optimizer] == 0) need = sat_add(need, m.spare[it.optimizer]);
    if (need > m.cap[t]) return false;
  }
  return true;
}

void put(const Model& m, State& s, std::size_t item, int place) {
  const Item& it = m.items[item];
  for (int t = 0; t < 3; ++t) s.used[t] += it.bytes[place][t];
  if (place == kNvme && s.on_nvme++ == 0) s.used[kHost] += m.buffer;
  if (place == kNvme && s.on_nvme_of[it.optimizer]++ == 0) s.used[kNvme] += m.spare[it.optimizer];
  s.moved += it.moved[place];
  s.place[item] = place;
}

void take(const Model& m, State& s, std::size_t item) {
  const Item& it = m.items[item];
  const int place = s.place[item];
  for (int t = 0; t < 3; ++t) s.used[t] -= it.bytes[place][t];
  if (place == kNvme && --s.on_nvme == 0) s.used[kHost] -= m.buffer;
  if (place == kNvme && --s.on_nvme_of[it.optimizer] == 0) s.used[kNvme] -= m.spare[it.optimizer];
  s.moved -= it.moved[place];
  s.place[item] = -1;
}

bool complete(const Model& m, const State& s) {
  for (int t = 0; t < 3; ++t) {
    if (s.used[t] > m.cap[t]) return false;  // the fixed parts alone, when there are no items
  }
  return std::none_of(s.place.begin(), s.place.end(), [](int q) { return q < 0; });
}

}  // namespace strata::offload::detail
