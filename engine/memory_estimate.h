// MemoryEstimate: what one rank of the engine will hold on each tier, per kind, at its peak,
// computed from the registrations and the configuration without allocating the model
// (docs/offload.md, "How the estimate and the plan are built"). `strata estimate` prints it.
//
// Protocol. estimate_memory() lays the model out as setup() would, places it with the same
// policy (PlacementPlan: the static DeepSpeed form, or the budget-driven planner, which
// refuses a budget nothing fits and names the smallest that would), then sizes each part
// from the functions the parts allocate with: the resident model state per tier (parameters
// and stage-3 shards, fp32 accumulators, fp32 master and moments; a frozen layer's parameters
// alone) is what setup() allocates, byte for byte; the NVMe swap files and their pinned buffers are the stores'
// footprints; the reduction scratch is the reducer's. Buffers that come and go during a step are bounded by the
// engine's rules: the gradient buffer the trainer fills (with overlap_comm also those the queued reductions hold:
// GradReducer::max_in_flight of the largest layers); at stage 3 the gathered window (prefetch and retention fill the
// device up to stage3_max_live_parameters and the room the rest leaves), the pinned staging of the gathers in flight
// (the prefetch window), the updated copies staged for the host link or NVMe (one layer; every NVMe layer's shards
// while their write-backs queue) and the device copies of the device optimizer for off-device shards (one layer, in the
// optimizer step, when nothing is gathered). With overlap_step and no host budget, each host layer's spare optimizer
// arrays (OptimizerState::spare: 12 bytes an element, 8 with bf16 moments, 6.125 with q8). Each tier's step buffers are
// capped by what its budget leaves. A tier's peak adds the kinds' peaks: an upper bound, reached when the buffers'
// peaks coincide.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/config.h"
#include "engine/engine.h"
#include "engine/layout.h"
#include "offload/ledger.h"

namespace strata::engine {

struct EstimateInput {
  EngineConfig config;
  std::vector<ParamSpec> params;  // the model's registrations, in order
  int world = 1;
  int rank = 0;
  std::uint64_t device_budget = 0;         // bytes of device memory (the device's budget)
  std::uint64_t trainer_device_bytes = 0;  // what the trainer holds there before setup() (activations)
  bool device_collectives = false;         // EngineOptions::device_comm with world > 1 (NCCL on GPUs)
  bool device_in_host_ram = true;          // the host-emulated device
  int layers_at_once = 1;                  // layers the trainer keeps gathered together (Engine::reserve_for_trainer)
};

struct TierEstimate {
  std::array<std::uint64_t, kKinds> kind{};  // peak bytes per kind (params, grads, optimizer, buffers)
  std::uint64_t total() const noexcept;
};

struct MemoryEstimate {
  std::array<TierEstimate, kTiers> tiers;  // device, host, nvme: the engine's ledger
  std::uint64_t trainer_device_bytes = 0;  // the trainer's own device memory, beside the engine's
  std::uint64_t device_minimum = 0;        // the smallest device budget the placement accepts, beside the trainer's
  std::uint64_t params = 0;                // the model's parameters (elements)
  std::uint64_t largest_layer_params = 0;  // of its largest layer (DeepSpeed's estimators' L)
  std::uint64_t largest_layer_padded = 0;  // the same padded: its gathered copy and gradient buffer, in elements
  std::uint64_t window_elems = 0;          // stage 3: the gathered window (prefetched and retained layers)
  std::string placement;                   // what lives where and why (PlacementPlan::explain)
  std::uint64_t optimizer_elems = 0;       // this rank's fp32 master elements (what its optimizer steps)
  std::uint64_t swap_file_host_bytes = 0;  // host RAM of the open NVMe swap files (tables), beside the ledger
  // Bytes moved per step by the placement (PlacementPlan::traffic: the host-trainer contract's
  // gathers, every micro-batch's gradients), over the host link and to and from NVMe.
  std::uint64_t h2d_bytes = 0, d2h_bytes = 0, nvme_read_bytes = 0, nvme_write_bytes = 0;
};

MemoryEstimate estimate_memory(const EstimateInput& in);

}  // namespace strata::engine
