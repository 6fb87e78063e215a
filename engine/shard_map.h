// ShardMap: the one record of where each layer's shards live (docs/design.md, "The engine's
// parts"): the tier of its optimizer state (and with it its gradient accumulator: the device
// with device state, host RAM otherwise), the tier of its stage-3 parameter shards, and whether
// it stays gathered on the device (persistent, stage 3 under
// stage3_param_persistence_threshold).
//
// Protocol. PlacementPlan owns the map and is its only writer: place() records its decision
// per layer before anything is allocated, and after a migration of parameter shards it records
// where each layer's shards went (move_params). Every other part reads it through a const
// reference in its Context: the parameter homes, the gathers, the update staging, the
// optimizer state and, through it, the checkpoints. Optimizer state never changes tier during a
// run; parameter shards change tier only between a step's gathers and its optimizer.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include "offload/tier.h"

namespace strata::engine {

class ShardMap {
 public:
  using Tier = offload::Tier;
  explicit ShardMap(const std::vector<bool>& persistent) : layers_(persistent.size()) {
    for (std::size_t li = 0; li < persistent.size(); ++li) layers_[li].persistent = persistent[li];
  }

  void place(int li, Tier opt, Tier params) {
    layers_[at(li)].opt = opt;
    layers_[at(li)].params = params;
  }
  void move_params(int li, Tier to) { layers_[at(li)].params = to; }

  Tier opt_tier(int li) const { return layers_[at(li)].opt; }
  Tier param_tier(int li) const { return layers_[at(li)].params; }
  bool persistent(int li) const { return layers_[at(li)].persistent; }
  // A frozen layer has no optimizer state or accumulator: its opt_tier() is the device's by
  // convention and nothing is counted or allocated for it.
  bool acc_on_host(int li) const { return opt_tier(li) != Tier::device; }
  bool any_acc_on_host() const {
    return std::any_of(layers_.begin(), layers_.end(), [](const Place& p) { return p.opt != Tier::device; });
  }
  std::vector<Tier> param_tiers() const { return column(&Place::params); }  // per layer
  bool any_opt_on(Tier t) const { return count(&Place::opt, t) > 0; }
  bool any_params_on(Tier t) const { return count(&Place::params, t) > 0; }
  std::size_t size() const noexcept { return layers_.size(); }

 private:
  struct Place {
    Tier opt = Tier::device;
    Tier params = Tier::device;
    bool persistent = false;
  };
  static std::size_t at(int li) { return static_cast<std::size_t>(li); }
  std::vector<Tier> column(Tier Place::*field) const {
    std::vector<Tier> out;
    for (const auto& p : layers_) out.push_back(p.*field);
    return out;
  }
  std::ptrdiff_t count(Tier Place::*field, Tier t) const {
    return std::count_if(layers_.begin(), layers_.end(), [&](const Place& p) { return p.*field == t; });
  }

  std::vector<Place> layers_;
};

}  // namespace strata::engine
