// OptimizerStep: a step once its gradients are in (docs/design.md, "The engine's parts"), run
// over three parts: StepScalars (the norm, the plan, the counters), ShardUpdate (the
// arithmetic on each shard) and OverlappedStep (the lane that may have done part of the step
// during backward, and its tail).
//
// Protocol. begin() starts the step's overlapped lane on StepScalars' bet. run() lets the last step's tail end, asks
// StepScalars for the plan (the caller has synchronized the reductions), has OverlappedStep keep or undo the lane's
// work against it (overlapped_step.h), then skips an overflowed step (the scaler has moved), else runs the optimizer
// through ShardUpdate with the next learning rate: NVMe state in the swapper's sub-group order (unless a tail steps
// it), then resident state in layer then bucket order (on the device stream where it lives on the device, else on the
// CPU). Updated compute copies go through UpdateStaging; parameter shards on NVMe are committed behind the update on
// the I/O worker; then the step counts (the engine then has ParamHomes refresh the replicated and persistent parameters
// from the new shards). An update that fails rolls back before it rethrows: device work and queued I/O are let finish,
// the NVMe parameter store keeps its last committed state, the staging is dropped, and the loss scaler and the count of
// optimizer steps stay as they were (the count of calls moves). A step that fails before its plan is known (the norm,
// or the loss scaler giving up at its minimum scale) first undoes the lane's work.
#pragma once

#include <functional>

#include "engine/engine.h"
#include "engine/overlapped_step.h"
#include "engine/shard_update.h"
#include "engine/step_scalars.h"
#include "optim/step_args.h"

namespace strata::engine {

class OptimizerStep {
 public:
  struct Context {  // what the step reads and updates and does not own
    const EngineConfig& cfg;
    int rank = 0;
    StepScalars& scalars;
    ShardUpdate& update;
    OverlappedStep& overlap;
    IoStats& io;
    // Waits for the device stream's work and the NVMe parameter store's queue, logging (not throwing)
    // what failed: what a failed update still has queued finishes before its staging goes.
    std::function<void()> settle;
  };

  explicit OptimizerStep(const Context& ctx) : c_(ctx) {}
  OptimizerStep(const OptimizerStep&) = delete;
  OptimizerStep& operator=(const OptimizerStep&) = delete;

  // begin_step(): the overlapped lane starts on StepScalars' bet (allowed: false while the
  // first trace may still move parameter shards).
  void begin(bool allowed);
  StepResult run();

 private:
  void run_optimizer(const optim::StepArgs& base, float lr);
  void roll_back() noexcept;

  Context c_;
};

}  // namespace strata::engine
