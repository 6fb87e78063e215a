// OptimizerStep: the arithmetic of a step once its gradients are in (docs/design.md, "The
// engine's parts"). It owns the loss scaler and the step counters (step() calls, and steps
// the optimizer ran), and runs the update on every shard wherever its state lives.
//
// Protocol. run() reads every layer's accumulator (the caller has synchronized the
// reductions) and: (1) sums this rank's squared gradient norm over its shard of every bucket in
// bucket order, on the side that holds the accumulator, and combines the ranks' sums in rank
// order, so every stage, rank and world sees the same bits; (2) averages over ranks and
// micro-batches and asks the loss scaler and gradient clipping for the step's plan; (3) skips
// an overflowed step (the scaler moves), else counts the step, takes its learning rate from the
// schedule and runs the optimizer: resident state in layer then bucket order (on the device
// stream where it lives on the device, else on the CPU), NVMe state in the swapper's sub-group
// order. Updated compute copies go through UpdateStaging; parameter shards on NVMe are
// committed behind the update on the I/O worker; then ParamHomes refreshes the replicated and
// persistent parameters. An update that fails rolls back before it rethrows: device work and
// queued I/O are let finish, the NVMe parameter store keeps its last committed state, the
// staging is dropped, and the loss scaler and the count of optimizer steps stay as they were
// (the count of calls moves). Bits depend only on the gradients, the configuration and the
// counters, never on where state lives or how the swapper cuts it (every optimizer but LAMB
// is elementwise; LAMB runs at stage 0 on whole tensors).
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
// the synchronous step uses: step_args()) and the lane finishes the step as the tail. An
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
#include "engine/update_staging.h"
#include "optim/grad_norm.h"
#include "optim/loss_scaler.h"
#include "optim/step_args.h"
#include "optim/step_plan.h"
#include "runtime/comm/communicator.h"
#include "runtime/core/error.h"
#include "runtime/core/trace.h"
#include "runtime/device/device.h"

namespace strata::engine {

class OptimizerStep {
 public:
  struct Context {  // what the step reads and updates and does not own
    const EngineConfig& cfg;
    const Layout& layout;
    int rank = 0, world = 1;
    DType cdt = DType::fp32;
    device::Device& dev;
    device::Stream& dev_stream;  // the device optimizer's stream
    comm::Communicator* comm;    // null: one rank
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
    comm::Communicator* pipeline = nullptr;  // EngineOptions::pipeline_comm, or null
    Tracer* tracer = nullptr;                // the host optimizer's spans, or null
  };
  // What a checkpoint saves and restores.
  struct Counters {
    std::int64_t steps_taken = 0;  // steps the optimizer ran (the schedule's and Adam's step)
    std::int64_t step_calls = 0;   // step() calls, skipped ones included
    optim::LossScaler::State scaler;
  };

  OptimizerStep(const Context& ctx, const optim::LossScalerConfig& scaler);
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
  double loss_scale() const noexcept { return scaler_.scale(); }
  std::int64_t calls() const noexcept { return calls_; }
  Counters counters() const noexcept { return {taken_, calls_, scaler_.state()}; }
  void restore(const Counters& c);

 private:
  optim::GradNorm global_grad_norm();
  void run_optimizer(const optim::StepArgs& base, float lr);
  void run_resident(const optim::StepArgs& base, float lr);
  void run_swapped(const optim::StepArgs& base, float lr);
  void run_lamb(const optim::StepArgs& base, float lr);
  void update_sub_group(const optim::StepArgs& base, float lr, const offload::SubGroup& g);
  double averaging() const;  // ranks x micro-batches: what the summed gradients are divided by
  // The optimizer on elements [e0, e0 + n) of bucket k's range in layer li (the whole bucket
  // at stage 0, this rank's shard of it above), with master/m/v wherever they live; with
  // `from`, out of place: the state is read from there and the stepped state written to
  // master/m/v (the overlapped step's spare arrays).
  // The moments are in the state's moment dtype (OptimizerState::moment_at).
  struct Source {
    const float* master;
    const void *m, *v;
  };
  void update_range(const optim::StepArgs& base, float lr, int li, std::size_t k, std::size_t e0, std::size_t n,
                    float* master, void* m, void* v, Source from = {nullptr, nullptr, nullptr});
  // One piece of that range whose parameters share lr_scale.
  void update_piece(const optim::StepArgs& base, float lr, float lr_scale, int li, std::size_t k, std::size_t e0,
                    std::size_t n, float* master, void* m, void* v, Source from);
  // Of bucket k of layer li: where the accumulator's elements for this rank's update begin.
  std::size_t grad_offset(int li, std::size_t k, bool whole_bucket) const;
  // Layer li's accumulator from element `elem` on (its dtype is c_.grads.acc_dtype(li)).
  const void* grad_at(int li, std::size_t elem) const;
  // Adds this rank's share of layer li's squared gradient norm to `into`, bucket by bucket.
  void add_layer_norm(int li, optim::GradNorm& into) const;
  optim::GradNorm bucket_norm(int li, std::size_t k) const;  // this rank's share of bucket k of layer li
  // This rank's share of the norm over every pipeline stage's layers (Context::pipeline).
  optim::GradNorm pipeline_norm() const;
  void roll_back() noexcept;
  optim::StepArgs step_args(const optim::StepPlan& plan) const;  // every step's arguments but the learning rate
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
  optim::LossScaler scaler_;
  std::int64_t taken_ = 0;
  std::int64_t calls_ = 0;
};

}  // namespace strata::engine
