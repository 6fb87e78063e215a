// Budget-driven placement of one rank's model state on the tiers device / pinned host / NVMe:
// per layer, where its fp32 optimizer state and (at ZeRO stage 3) its parameter shard live
// so that every tier stays within its memory_budget and the fewest bytes cross the host
// link and the NVMe per step. Pure: no allocation, no I/O; the engine acts on the result.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "offload/tier.h"

namespace strata::offload {

struct PlacementLayer {
  std::string name;                // "layer 3", for explain() and errors
  std::uint64_t shard_elems = 0;   // this rank's shard of the layer (stage>=1); = padded at stage 0
  std::uint64_t padded_elems = 0;  // the whole padded layer
  int gathers_per_step = 2;        // stage 3: times the layer is gathered per step (from the recorded trace)
  bool frozen = false;             // no gradient and no optimizer state: its parameters are all it places
  // Its optimizer state on NVMe is scanned before each step as well (Muon's hidden matrices:
  // their momentum is needed whole before the step proper), and the scan's result kept in host
  // RAM until the step: exp_avg read again, (state_bytes - 4) E / 2 more per step, and 4E more
  // on the host.
  bool nvme_scan = false;
  // Bytes its optimizer state takes less in device memory or host RAM than state_bytes x E
  // (Muon keeps no exp_avg_sq for hidden matrices there; its swap files keep all three arrays).
  std::uint64_t resident_saving = 0;
};

struct PlacementProblem {
  int stage = 3;                    // ZeRO stage 0..3
  std::uint32_t compute_bytes = 2;  // bytes per element of compute copies (bf16/fp16 2, fp32 4)
  // Bytes per element of optimizer state: the fp32 master and two moments (12, 8 with bf16
  // moments, 6.125 with q8 ones: shards are whole 16-element blocks, so state_bytes x E is exact).
  double state_bytes = 12;
  int accumulation_steps = 1;  // micro-batches per step
  // Bytes per element of a gradient accumulator in host RAM: 4 (fp32), or the compute bytes
  // where each step adds exactly one gradient to it (engine/grad_reducer.h). On the device: 4.
  std::uint32_t host_accumulator_bytes = 4;
  std::vector<PlacementLayer> layers;
  std::uint64_t device_budget = 0, host_budget = 0, nvme_budget = 0;  // bytes; 0 = unlimited for nvme only
  // Bytes of memory_budget.device the trainer holds (its activations), already taken out of
  // device_budget: a refusal names the budget as configured and asks for this much more.
  std::uint64_t device_held = 0;
  bool nvme_available = false;  // an nvme_path is configured (otherwise nothing may go to NVMe)
  // NVMe bytes per byte placed there (nvme_copies: parameter shards, nvme_state_copies:
  // optimizer state): the engine keeps two generations of every swap file (the last good state
  // survives a failed step), so it passes 2; with spare files shared per chunk length
  // (offload_optimizer.spare_sub_groups, offload_param.spare_chunks) the files take their bytes
  // once, 1, plus the spare files: NVMe bytes taken once any parameter shard
  // (nvme_param_spare_bytes) or any optimizer state (nvme_state_spare_bytes) is placed there.
  std::uint32_t nvme_copies = 1, nvme_state_copies = 1;
  std::uint64_t nvme_param_spare_bytes = 0, nvme_state_spare_bytes = 0;
  // Stage-3 gathers all-gather in device memory (the engine's device collectives, NCCL on
  // GPUs): only the shard crosses the link, c*E per gather from a host or NVMe shard and
  // nothing from a device shard, instead of the whole layer through pinned staging.
  bool device_gathers = false;
  // Always on device: live window (gathered layers, gradient buffers), persistent layers.
  std::uint64_t device_fixed_bytes = 0;
  std::uint64_t host_fixed_bytes = 0;   // always on host: reduction scratch, gather staging
  std::uint64_t nvme_buffer_bytes = 0;  // host bytes the NVMe swap buffers take once anything lives on NVMe
  std::optional<Tier> optimizer_fixed, params_fixed;  // DeepSpeed static form: every layer forced to this place
  // Exact refinement after the greedy passes: at most this many branch-and-bound nodes
  // (10^5 take a few ms). 0 = greedy only. The default usually completes up to ~16 layers.
  std::uint64_t search_nodes = 200000;
};

struct LayerPlacement {
  Tier optimizer = Tier::device;
  Tier params = Tier::device;
};

struct Placement {
  std::vector<LayerPlacement> layers;         // one per problem layer, same order
  std::array<std::uint64_t, 3> tier_bytes{};  // model-state bytes per tier (device, host, nvme) incl. the fixed parts
  std::uint64_t h2d_bytes = 0, d2h_bytes = 0, nvme_read_bytes = 0, nvme_write_bytes = 0;  // per step, predicted
  bool proven_optimal = false;                           // the search completed: no placement moves fewer bytes
  std::uint64_t moved_bytes() const noexcept;            // sum of the four
  std::string explain(const PlacementProblem& p) const;  // multi-line: what lives where and why
};

// Protocol. The engine fills a PlacementProblem once its layout and first step's gather
// trace are known, calls plan_placement() and allocates each layer's optimizer state and
// parameter shard where the result says; the planner owns nothing and keeps no state.
//
// Cost model, per layer (E = shard_elems, P = padded_elems, c = compute_bytes,
// A = accumulation_steps, G = gathers_per_step). Two items may move:
//  * optimizer (stage >= 1): state_bytes x E (fp32 master + exp_avg + exp_avg_sq: 12E, 8E with
//    bf16 moments, 6.125E with q8 ones) on its place,
//    plus the gradient accumulator, 4E (stage 2-3) or 4P (stage 0-1), on the device when
//    the optimizer is there, else on the host (host_accumulator_bytes per element there).
//    Off the device it costs A*P*c d2h (gradients each micro-batch) and c*E h2d (updated
//    params) per step; on NVMe also 12E read and 12E written (a layer with nvme_scan: 16E
//    read, and 4E more on the host). At stage 0 it is always on the device.
//  * params (stage 3): the c*E shard on its place. A gather stages shards through pinned
//    host memory (engine/gather.cc), so a device shard costs G*c*E d2h + G*c*P h2d,
//    a host shard G*c*P h2d, an NVMe shard G*c*P h2d + G*c*E read + c*E written: host is
//    cheapest, then device, then NVMe. With device_gathers a device shard costs nothing,
//    a host shard G*c*E h2d, an NVMe shard G*c*E h2d + G*c*E read + c*E written. Below
//    stage 3 params are c*P on the device, unmoved.
// nvme_buffer_bytes are charged to the host once any item lives on NVMe.
//
// Algorithm (minimise moved bytes subject to the budgets: a knapsack per tier).
//  1. Fixed items (optimizer_fixed, params_fixed) go to their place.
//  2. Device: optimizer items in one of three orders (traffic saved against the host per
//     device byte; the same against NVMe; size), each where it still fits. Params only
//     come later: a device shard moves more than a host one (with device_gathers they
//     join this pass, where a device shard moves nothing).
//  3. Host: if everything left fits on the host, it all goes there. Otherwise the host
//     keeps the accumulators of offloaded optimizers and the swap buffers, then takes the
//     rest by NVMe traffic saved per host byte (params G+1, optimizer 2; ties larger
//     first); the rest goes to NVMe.
//  4. Params on NVMe or unplaced go to the device where they fit; an item that fits
//     nowhere moves one placed item to another tier if that makes room.
//  5. Local improvement while any applies: move an item to a place that moves fewer bytes;
//     or do so after moving one item out of that place.
//  6. Steps 1-5 run six times (the three orders, with and without NVMe: only a placement
//     with nothing on NVMe saves the swap buffers) and the best result is kept.
//  7. Branch and bound over all places (items largest first, bounded by the bytes and the
//     memory the remaining items need at least), seeded with that result, for at most
//     search_nodes nodes; then step 5 again. If it completes, the result is optimal
//     (proven_optimal) and plan_placement() refuses only problems nothing fits.
// Against exhaustive search (tests/offload/placement_brute_test.cc, "[brute]"): with the
// default search_nodes, every 3-4 layer problem is solved optimally, 16-layer problems are
// within 1.001x of the optimum; greedy alone (search_nodes = 0) misses 3 of 1455 feasible
// 3-4 layer problems (tight partitions) and moves at worst 1.23x the optimum (mean 1.001x).
// Cost: steps 1-6 are O(n^2) per improvement for n items (800 layers: ~0.25 s).
//
// Throws strata::Error(Errc::invalid_argument) for a malformed problem (stage, sizes, a
// *_fixed place the stage or the configuration forbids, naming the config key), and
// Errc::out_of_budget when no placement fits: the message names every tier that is short,
// its budget and the smallest budget that would fit, as the config key
// ("memory_budget.device", "memory_budget.host", "memory_budget.nvme"), and says when an
// nvme_path is needed ("offload_optimizer.nvme_path" / "offload_param.nvme_path").
Placement plan_placement(const PlacementProblem& problem);

// The bytes a given placement (layers[i]: layer i's places) takes per tier and moves per
// step under the cost model above, budgets aside: what a static placement costs, or one
// the engine re-planned. Places the problem's *_fixed forms would forbid are evaluated too
// (the static form keeps offload_param.max_in_cpu elements in host RAM).
Placement evaluate_placement(PlacementProblem problem, const std::vector<LayerPlacement>& layers);

// The smallest budget of `tier` with which plan_placement(problem) succeeds, the other
// budgets as they are, found by bisection: plan_placement() accepts it and refuses one byte
// less. nullopt if no budget does (or tier is nvme and !nvme_available; for nvme, 0 =
// unlimited is not a candidate). When the search completes (small problems) feasibility
// grows with the budget, so no smaller budget fits any placement; on large problems the
// greedy passes need not be monotone in the budget, and the value is a boundary of them.
// Device and host budgets are bytes, 0 meaning 0: the engine passes UINT64_MAX for "not set".
std::optional<std::uint64_t> min_budget_bytes(const PlacementProblem& problem, Tier tier);

}  // namespace strata::offload
