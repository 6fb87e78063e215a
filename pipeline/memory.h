// What a stage's activations cost on its device, from the schedule alone: the executor's
// buffers (executor.cc) replayed along the stage's action list, with the allocations and
// frees it makes for each action (the layers' work buffer, held throughout; inputs and
// outputs of every layer, saved tensors, the
// gradients kept from B for W, received tensors, weight gradients waiting for their turn,
// re-materialization's recomputed chunks), each rounded as the device rounds it. Frees
// come at the end of an action (the executor frees after its synchronize), so the peak is
// the one the device sees for these buffers: tests hold it equal to the measured peak of a
// stage on a device of its own. Beside an engine on a shared device the two add up.
//
// A device allocator can still fail at that peak: buffers of many sizes come and go, and
// the free bytes end up in pieces. The replay therefore also counts, per buffer size, the
// most buffers of that size live at once; a pool with that many slots of each size
// (device::PoolDevice, pool_bytes() in all) holds every buffer the stage allocates in any
// order, which is what a stage on a ZeRO engine reserves.
#pragma once

#include <cstdint>
#include <map>

#include "pipeline/executor.h"
#include "pipeline/model.h"
#include "pipeline/schedule.h"

namespace strata::pipeline {

struct StageMemory {
  std::uint64_t peak_bytes = 0;  // device bytes of the executor's buffers at their peak
  int peak_live = 0;             // (micro-batch, chunk) pairs live at once, F to W
  // Rounded buffer size -> the most buffers of that size live at once.
  std::map<std::uint64_t, int> peak_by_size;

  // Bytes of a pool with a slot for each: the sum of size x count (at least peak_bytes).
  std::uint64_t pool_bytes() const;
  // Whether a pool made for `reserved` has a slot for every buffer this needs.
  bool fits_in(const StageMemory& reserved) const;
};

// alignment: the device's allocation granule (device::Arena::kAlignment on the host device).
// backend: the stage's device; a CUDA stage keeps what the layers bind() makes keep
// (PipelineModel::saved_floats).
StageMemory stage_memory(const Schedule& schedule, int stage, const PipelineModel& model, Remat remat,
                         std::uint64_t alignment, device::Backend backend);

}  // namespace strata::pipeline
