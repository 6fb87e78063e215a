// OverlappedStep: the overlapped optimizer step (offload_optimizer.overlap_step; docs/design.md,
// "The engine's parts"): the lane that steps the NVMe layers, or the host layers, during
// backward, the keep-or-undo decision against the step's plan, the deferred step, and the tail
// that finishes a kept step while the next forward runs.
//
// Protocol. begin_step() calls begin() through OptimizerStep::begin(), with StepScalars' bet
// (step_bet.h): when some layers' optimizer state lives on NVMe or (none on NVMe) in host RAM,
// the lane (optimizer_lane.h) steps them in backward order (a swapper step over the NVMe layers,
// its reads running ahead from the start of the step, or the host layers), on the plan the step
// will have when nothing overflows and nothing is clipped (the current loss scale, clip
// coefficient 1, the next step's learning rate). The engine hands each layer over
// with layer_done() once its last reduction of the step is queued; the lane updates it while
// backward goes on, an NVMe layer's new state going to the swapper's spare files, a host
// layer's to its spare arrays (OptimizerState::spare: the layer's state copied, then stepped),
// and the compute copies to their tier (NVMe shards: the parameter store's uncommitted writes).
// OptimizerStep::run() calls before_step() (the last step's tail ends) and computes the global
// norm and the plan as always, then settle(plan, its arguments): when the plan's gradient scale is the
// speculated one (same bits) the pending state commits, the host layers' spare arrays become
// their state and the other resident layers step; otherwise (overflow, clipping) the lane's work
// is undone (pending swapper writes, spare arrays and parameter writes dropped, compute copies
// rebuilt from the unchanged masters: ShardUpdate::restore_copies) and the step runs
// synchronously. Host layers step in OptimizerStep::run() instead under a host budget
// (memory_budget.host: the placement fills it), as does a layer whose spare arrays the host
// memory refuses. Either way the bits are those of the synchronous step. The lane gives up by
// itself, before work it would undo, once this rank's partial squared norm is non-finite or
// above the clipping threshold (lane_run.h). cancel() abandons the lane's work (the engine's
// shutdown).
//
// Deferred step. Under gradient_clipping, where the step may end as a tail (below), a bet lost to
// clipping is not redone synchronously: the lane is undone and the real step runs as the tail.
// After a step that clipped the lane bets on nothing: begin() starts it deferred
// (start_deferred()), its swapper step reading ahead lowest layer first while its first update
// waits at the lane's plan gate; settle() publishes the plan's arguments (the ones the
// synchronous step uses: StepScalars::args()) and the lane finishes the step as the tail. An
// overflowed step cancels it (it wrote nothing). Either way no state is written before the norm
// is known, and the bits are the synchronous step's.
//
// The tail. At stage 3 with every layer's state on NVMe and none persistent, a kept step whose
// lane has layers left does not wait for them: settle() commits what the lane wrote so far and
// the step returns, and the lane steps the rest lowest layer first (what the next forward needs
// first), committing each layer's parameter shards behind their write, zeroing its accumulator,
// and the swapper's step at its end. Before the trainer touches layer li (gather, gradient
// buffer, reduction) the engine calls before_layer(li), which waits until the tail has stepped li
// (the gather path's prefetch waits the same way). begin_step() during a tail arms the next lane,
// started when the tail ends; finish_tail() waits for it (synchronize(), checkpoints,
// full_parameters()). Its traffic counts in the step during which it ends. A tail that fails
// leaves layers from different steps: the error says so and no lane starts again.
#pragma once

#include <exception>
#include <memory>
#include <vector>

#include "engine/config.h"
#include "engine/engine.h"
#include "engine/grad_reducer.h"
#include "engine/lane_run.h"
#include "engine/layout.h"
#include "engine/optimizer_state.h"
#include "engine/shard_update.h"
#include "engine/step_bet.h"
#include "optim/step_args.h"
#include "optim/step_plan.h"
#include "runtime/device/device.h"

namespace strata::engine {

class OverlappedStep {
 public:
  // What the step reads and updates and does not own: its lane's (it owns the lane and reads
  // nothing the lane does not).
  using Context = LaneRun::Context;
  struct Outcome {             // what settle() did with the lane's work
    bool rolled_back = false;  // undone: the step runs synchronously, or as the tail
    bool deferred = false;     // a deferred lane finishes the step as the tail
    int tail_layers = 0;       // layers left to the tail when the step was kept
  };

  explicit OverlappedStep(const Context& ctx) : c_(ctx), run_(ctx) {}
  OverlappedStep(const OverlappedStep&) = delete;
  OverlappedStep& operator=(const OverlappedStep&) = delete;

  // allowed: false when this step may still move parameter shards (the first trace's replan);
  // bet: what the lane speculates on (StepScalars::bet()).
  void begin(bool allowed, const StepBet& bet);
  bool active() const noexcept { return run_.active() || armed_ >= 0; }
  // Layer li's gradient is complete once `done` (null: already) has passed.
  void layer_done(int li, std::unique_ptr<device::Event> done);
  void cancel() noexcept;
  void before_layer(int li);
  void finish_tail();
  // Zeroes the accumulators for the next step, but those a running tail zeroes itself.
  void zero_grads();

  // OptimizerStep::run()'s side: before_step() before the plan, settle() once it is known.
  void before_step();
  // args and lr: the optimizer's arguments for the plan (a deferred lane runs on them).
  Outcome settle(const optim::StepPlan& plan, const optim::StepArgs& args, float lr);
  bool tail() const noexcept { return run_.tail().running(); }  // a tail runs: it steps and commits the swapped layers
  // Per layer: settle() kept the lane's update of the host layer (the synchronous step skips it).
  const std::vector<char>& kept_host_layers() const noexcept { return run_.host().kept(); }

 private:
  void start_deferred();                                     // a lane that waits for publish_plan()
  bool publish_plan(const optim::StepArgs& args, float lr);  // its arguments, then the gate: it runs as the tail
  // After a lost bet, where the step may end as a tail.
  void redo_as_tail(const optim::StepPlan& plan, const optim::StepArgs& args, float lr);
  // The lane's half of an overlapped step: wait for it, then keep its work or undo it.
  // False when it was undone (true with no lane at all).
  bool finish_overlap(const optim::StepPlan& plan, const optim::StepArgs& args, float lr);

  Context c_;
  LaneRun run_;                    // the lane, its host layers and its tail
  float speculated_scale_ = 0.0f;  // the plan's grad_scale the lane's work assumed
  bool deferred_ = false;          // this step's lane waits for the plan
  bool clipped_last_ = true;       // the last step clipped (or none ran yet): defer, do not bet
  bool tail_ok_ = false;           // this step's lane may finish as a tail
  int armed_ = -1;                 // begin(allowed) waiting for the tail: -1 none, 0/1
  StepBet armed_bet_;              // ... and its bet
};

}  // namespace strata::engine
