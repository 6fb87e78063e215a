// OptimizerStep: a step once its gradients are in (docs/design.md, "The engine's parts"). It
// runs the step over two parts, StepScalars (the norm, the plan, the counters) and ShardUpdate
// (the arithmetic on each shard), and owns the overlapped lane and its tail.
//
// Protocol. run() asks StepScalars for the plan (the caller has synchronized the reductions),
// settles the lane's work against it (below), then skips an overflowed step (the scaler has
// moved), else runs the optimizer with the next learning rate: resident state through
// ShardUpdate in layer then bucket order (on the device stream where it lives on the device,
// else on the CPU), NVMe state in the swapper's sub-group order. Updated compute copies go
// through UpdateStaging; parameter shards on NVMe are committed behind the update on the I/O
// worker; then ParamHomes refreshes the replicated and persistent parameters and the step
// counts. An update that fails rolls back before it rethrows: device work and queued I/O are
// let finish, the NVMe parameter store keeps its last committed state, the staging is
// dropped, and the loss scaler and the count of optimizer steps stay as they were (the count
// of calls moves).
//
// Overlapped step (offload_optimizer.overlap_step). begin_step() calls begin_overlap(): when
// some layers' optimizer state lives on NVMe or (none on NVMe) in host RAM, the lane
// (optimizer_lane.h) steps them in backward order (a swapper step over the NVMe layers, its
// reads running ahead from the start of the step, or the host layers), on the plan the step will
// have when nothing overflows and nothing is clipped (the current loss scale, clip
// coefficient 1, the next step's learning rate). The engine hands each layer over with
// layer_done() once its last reduction of the step is queued; the lane updates it while
// backward goes on, an NVMe layer's new state going to the swapper's pending generation, a
// host layer's to its spare arrays (OptimizerState::spare: the layer's state copied, then
// stepped), and the compute copies to their tier (NVMe shards: the parameter store's
// uncommitted writes). run() then computes the global norm and the plan as always: when the
// plan's gradient scale is the speculated one (same bits) the pending state commits, the host
// layers' spare arrays become their state and the other resident layers step; otherwise
// (overflow, clipping) the lane's work is undone (pending generation, spare arrays and
// parameter writes dropped, compute copies rebuilt from the unchanged masters) and the step
// runs synchronously. Host layers step in run() instead under a host budget
// (memory_budget.host: the placement fills it), as does a layer whose spare arrays the host
// memory refuses. Either way the bits are those of the synchronous step. The lane gives up by itself, before work it
// would undo, once this rank's partial squared norm is non-finite or above the clipping threshold (check_bet()).
// cancel_overlap() abandons the lane's work (the engine's shutdown).
//
// Deferred step. Under gradient_clipping, where the step may end as a tail (below), a bet
// lost to clipping is not redone synchronously: the lane is undone and the real step runs as
// the tail. After a step that clipped the lane bets on nothing: begin_overlap() starts it
// deferred (start_deferred()), its swapper step reading ahead lowest layer first while its
// first update waits at the lane's plan gate; run() publishes the plan's arguments (the ones
// the synchronous step uses: StepScalars::args()) and the lane finishes the step as the tail. An
// overflowed step cancels it (it wrote nothing). Either way no state is written before the
// norm is known, and the bits are the synchronous step's.
//
// The tail (optimizer_overlap.cc). At stage 3 with every layer's state on NVMe and none
// persistent, a kept step whose lane has layers left does not wait for them: run() commits
// what the lane wrote so far and returns, and the lane steps the rest lowest layer first
// (what the next forward needs first), committing each layer's parameter shards behind their
// write, zeroing its accumulator, and the swapper's generation at its end. Before the
// trainer touches layer li (gather, gradient buffer, reduction) the engine calls
// before_layer(li), which waits until the tail has stepped li (the gather path's prefetch
// waits the same way). begin_step() during a tail arms the next lane, started when the tail
// ends; finish_tail() waits for it (synchronize(), checkpoints, full_parameters()). Its
// traffic counts in the step during which it ends. A tail that fails leaves layers from
// different steps: the error says so and no lane starts again.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "engine/config.h"
#include "engine/engine.h"
#include "engine/grad_reducer.h"
#include "engine/layout.h"
#include "engine/nvme_homes.h"
#include "engine/optimizer_lane.h"
#include "engine/optimizer_state.h"
#include "engine/param_homes.h"
#include "engine/placement_plan.h"
#include "engine/shard_update.h"
#include "engine/step_scalars.h"
#include "engine/update_staging.h"
#include "optim/grad_norm.h"
#include "optim/step_args.h"
#include "optim/step_plan.h"
#include "runtime/core/error.h"
#include "runtime/core/trace.h"
#include "runtime/device/device.h"

namespace strata::engine {

class OptimizerStep {
 public:
  struct Context {  // what the step reads and updates and does not own
    const EngineConfig& cfg;
    const Layout& layout;
    int rank = 0;
    StepScalars& scalars;
    ShardUpdate& update;
    GradReducer& grads;
    OptimizerState& state;
    const PlacementPlan& plan;
    UpdateStaging& updates;
    ParamHomes& homes;
    NvmeHomes& nvme;
    IoStats& io;
    // Waits for the device stream's work and the NVMe I/O worker's, logging (not throwing)
    // what failed: what a failed update still has queued finishes before its staging goes.
    std::function<void()> settle;
    Tracer* tracer = nullptr;  // the host optimizer's spans, or null
  };

  explicit OptimizerStep(const Context& ctx) : c_(ctx) {}
  OptimizerStep(const OptimizerStep&) = delete;
  OptimizerStep& operator=(const OptimizerStep&) = delete;

  StepResult run();
  // allowed: false when this step may still move parameter shards (the first trace's replan).
  void begin_overlap(bool allowed);
  bool overlapping() const noexcept { return lane_.active() || armed_ >= 0; }
  // Layer li's gradient is complete once `done` (null: already) has passed.
  void layer_done(int li, std::unique_ptr<device::Event> done);
  void cancel_overlap() noexcept;
  void before_layer(int li);
  void finish_tail();
  // Zeroes the accumulators for the next step, but those a running tail zeroes itself.
  void zero_grads();

 private:
  void run_optimizer(const optim::StepArgs& base, float lr);
  void run_swapped(const optim::StepArgs& base, float lr);
  void roll_back() noexcept;
  // The lane: the swapper's step in `order` (and the host layers, when host_layers), with
  // lane_args_ and lane_lr_ (set before it starts, or before the plan's gate opens).
  void launch_lane(const offload::OptimizerSwapper::StepOrder& order, bool host_layers);
  void start_deferred();                           // a lane that waits for publish_plan()
  bool publish_plan(const optim::StepPlan& plan);  // its arguments, then the gate: it runs as the tail
  void redo_as_tail(const optim::StepPlan& plan);  // after a lost bet, where the step may end as a tail
  // The lane's half of an overlapped step: wait for it, then keep its work or undo it.
  // False when it was undone (true with no lane at all).
  bool finish_overlap(const optim::StepPlan& plan);
  void undo_overlap() noexcept;
  // On the lane, once layer li's gradient is in: adds its part of this rank's squared norm
  // and abandons the lane's work (throws) when the step surely overflows or clips.
  void check_bet(int li);
  void plan_host_lane();                                      // host_order_ for this step's lane
  void step_host_layers(const optim::StepArgs& a, float lr);  // on the lane
  void layer_stepped(int li);                                 // on the lane, after layer li's last sub-group
  void count_lane_io();                                       // the lane's traffic into the step's, once it has joined
  std::exception_ptr join_lane();  // joins the lane, counts its wait and traffic; what it threw
  void add_swapper_stats(IoStats& io) const;

  Context c_;
  OptimizerLane lane_;
  float speculated_scale_ = 0.0f;  // the plan's grad_scale the lane's work assumed
  optim::StepArgs lane_args_;      // the lane's arguments (read on the lane)
  float lane_lr_ = 0.0f;
  bool deferred_ = false;         // this step's lane waits for the plan
  bool clipped_last_ = true;      // the last step clipped (or none ran yet): defer, do not bet
  IoStats lane_io_;               // the lane's traffic, added to the step's after it joins
  std::vector<char> touched_;     // per layer: the lane updated it (written on the lane, read after join)
  optim::GradNorm lane_partial_;  // this rank's squared norm over the layers the lane has taken
  double abandon_above_ = 0;      // ... above which the step surely clips
  bool abandoned_ = false;        // the lane stopped on a lost bet (not a failure)
  std::vector<int> host_order_;   // the host layers the lane steps, backward order
  std::vector<char> host_kept_;   // per layer: run() kept the lane's update (run_resident skips it)
  std::vector<char> no_spare_;    // per layer: its spare arrays did not fit; it steps in run()
  // The tail. Under tail_mu_, shared with the lane: settled_ (per layer, layer_stepped()),
  // kept_ (run() kept the lane's work while it ran), lane_done_ (its work returned or threw).
  std::mutex tail_mu_;
  std::condition_variable tail_cv_;
  std::vector<char> settled_;
  bool kept_ = false;
  bool lane_done_ = false;
  std::atomic<bool> ascending_{false};  // the swapper's ascending_rest
  bool tail_ok_ = false;                // this step's lane may finish as a tail
  bool tail_ = false;                   // a tail runs (the trainer's thread's view)
  int tail_layers_ = 0;                 // layers left to the tail when run() kept the step
  int armed_ = -1;                      // begin_overlap(allowed) waiting for the tail: -1 none, 0/1
  std::string tail_failure_;            // set when a tail failed: no lane starts again
  Errc tail_failure_code_ = Errc::internal;
};

}  // namespace strata::engine
