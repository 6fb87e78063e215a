// PlacementPlan: the engine's placement policy (docs/design.md, "The engine's parts"): which
// tier holds each layer's optimizer state (and with it the fp32 gradient accumulator: on the
// device with device optimizer state, in host RAM otherwise) and, at stage 3, its parameter
// shards. It owns the plan per layer and its explanation.
//
// Protocol. place() decides the plan before anything is allocated. The static form follows
// DeepSpeed: offload_optimizer.device and offload_param.device for every layer, with
// offload_param.max_in_cpu elements of NVMe parameter shards kept in host RAM instead (layers
// in order). With memory_budget set, the kinds whose offload device is left at "none" are
// placed by the budget-driven planner (offload/placement.h): per layer, the tiers that move
// the fewest bytes per step within the budgets, assuming the host-trainer contract's gathers
// (forward and backward of every micro-batch). A model that fits no placement is refused,
// naming the smallest budget that would fit; the device budget is checked against what the
// plan leaves there, naming the minimum. check_host_fit() (collective) checks host RAM on
// every host. After the first step, replan(recorded gathers) plans again with the recorded
// counts: when only parameter shards would move, it hands the new tiers to `migrate` (which
// returns the layers that stayed, or throws with nothing moved) and records where the shards
// went in the shard map; a plan that would also move optimizer state is reported and applies
// at the next start. The plan owns the shard map (shard_map.h), the one record of where each
// layer's shards live, and is its only writer: the other parts read shards().
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "engine/config.h"
#include "engine/engine.h"
#include "engine/layout.h"
#include "engine/shard_map.h"
#include "offload/placement.h"
#include "runtime/comm/communicator.h"

namespace strata::engine {

class PlacementPlan {
 public:
  struct Context {  // what the policy uses and does not own
    const EngineConfig& cfg;
    const Layout& layout;
    int rank = 0, world = 1;
    std::size_t cbytes = 4;
    std::uint64_t device_budget = 0;  // bytes of the device's memory the engine may use, with others
    bool device_in_host_ram = false;  // the host-emulated device: its memory is host RAM too
    comm::Communicator* comm = nullptr;
    bool device_collectives = false;
    std::uint64_t device_held_by_others = 0;  // device memory in use when setup() began, and reserved
    int layers_at_once = 1;                   // layers the trainer keeps gathered together
  };
  PlacementPlan(const Context& ctx, const std::vector<bool>& persistent);
  // Per layer: stays gathered on the device (stage 3, under stage3_param_persistence_threshold).
  static std::vector<bool> persistent_layers(const EngineConfig& cfg, const Layout& layout);

  void place();
  void check_host_fit() const;
  // Host bytes by part, as setup allocates them: every layer's host-tier state, the fixed
  // buffers (the reducer's scratch, gather and update staging) and the NVMe stores' smallest
  // buffers (one each; they take more, up to their buffer_count, where the budget leaves room).
  struct HostParts {
    std::uint64_t opt = 0, acc = 0, params = 0, fixed = 0, reducer = 0, swap_min = 0, param_min = 0;
    // Muon's host buffers at stages 1-3: one layer's gather and orthogonalization, and the
    // orthogonalized updates of the layers on NVMe, held from its scan to its step.
    std::uint64_t muon = 0;
    std::uint64_t total() const { return opt + acc + params + fixed + muon + swap_min + param_min; }
    // What setup allocates after the NVMe stores open: the layers' state and the fixed
    // buffers but the reducer's scratch (allocated before them).
    std::uint64_t after_stores() const { return opt + acc + params + fixed + muon - reducer; }
  };
  HostParts host_parts() const;
  // Bytes layer li's optimizer state takes less in device memory or host RAM than Adam's: Muon
  // keeps no exp_avg_sq for its hidden matrices (counted on the rank whose shard holds fewest).
  std::uint64_t muon_saving(int li) const;
  // With memory_budget.host, refuses a placement (static or budget-driven) whose host tier
  // cannot hold its parts before anything is allocated, naming each part and the minimum.
  void check_host_budget() const;
  // With memory_budget.nvme, refuses a placement whose swap files (every generation or spare of every
  // NVMe store) exceed it, before any is created, naming each store's bytes and the minimum.
  void check_nvme_budget() const;
  // The spare swap files (offload_optimizer.spare_sub_groups, offload_param.spare_chunks) the
  // planner reserves on NVMe once any optimizer state or parameter shard goes there, in bytes
  // (0 without spares: two generations are counted per byte placed).
  struct NvmeSpares {
    std::uint64_t state = 0, params = 0;
  };
  NvmeSpares nvme_spares() const;
  using Migrate = std::function<std::vector<int>(const std::vector<Tier>& to)>;
  void replan(const std::vector<int>& gathers, std::int64_t step, const Migrate& migrate);
  // replan() may still move stage-3 shards (budget-driven, not yet checked against a trace).
  bool replan_pending() const noexcept { return budget_driven() && c_.cfg.zero.stage == 3 && !checked_; }

  const ShardMap& shards() const noexcept { return shards_; }  // valid after place()
  bool budget_driven() const;
  // The bytes this plan moves per step and holds per tier under the planner's cost model
  // (offload/placement.h; the host-trainer contract's gathers): what `strata plan` times.
  offload::Placement traffic() const;
  const std::string& explain() const noexcept { return text_; }
  // After place(): the smallest device budget the plan accepts beside what the trainer
  // holds or reserves (the minimum its refusal names).
  std::uint64_t device_minimum() const noexcept { return device_minimum_; }

 private:
  // gathers: per layer, from the recorded trace; empty: the host-trainer contract's count.
  offload::PlacementProblem make_problem(const std::vector<int>& gathers) const;
  std::uint64_t check_device_fit(bool opt_on_device, bool params_on_device) const;  // returns the minimum
  std::uint64_t device_room() const;  // the device budget less what the trainer holds there
  std::uint64_t device_scratch_bytes() const;
  std::size_t shard(int li) const { return c_.layout.layer_shard(li); }
  std::uint32_t host_acc_bytes() const;  // per element of a gradient accumulator in host RAM
  // Layer li's state on NVMe takes Muon's scan as well (it holds a hidden matrix); the host
  // scratch of Muon's step at stages 1-3 (detail::muon_host_scratch), else 0.
  bool muon_scan(int li) const;
  std::uint64_t muon_scratch() const;
  std::string frozen_note() const;  // explain()'s line on frozen layers (empty without)

  Context c_;
  ShardMap shards_;
  std::string text_;  // explain(): what lives where and why
  std::uint64_t device_minimum_ = 0;
  bool checked_ = false;  // replan() ran (once)
};

}  // namespace strata::engine
