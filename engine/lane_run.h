// LaneRun: what the overlapped optimizer step's lane runs (overlapped_step.h has the protocol of
// the whole): the swapper's step over the NVMe layers and the host layers (host_lane.h) on its
// thread (optimizer_lane.h), the bet it checks as gradients come in, the tail it hands layers to
// (step_tail.h), its traffic, and the undo of what it wrote.
//
// Protocol. start(plan, bet) launches the lane: NVMe layers in plan.order (the swapper's pull
// step, reads running ahead), then the host layers when plan.host_layers. Before a layer's
// first update it waits for ready(li) and checks the bet: this rank's squared norm over the
// layers taken so far (GradReducer::add_shard_norm) above bet.abandon_above, or non-finite,
// abandons the lane (it throws; abandoned() says so) before work it would undo. A deferred plan
// waits instead for publish(args, lr), which gives the lane its arguments and opens its gate.
// With plan.tail each layer stepped goes to the tail, which may ask for the layers not begun
// lowest first; as the lane ends the tail commits the swapper's step if it kept the step. When the
// swapper's spare files for a sub-group's length are all lent, the lane waits for decide(keep)
// before it takes the sub-group: kept, sub-groups commit as it goes on; undone, it is abandoned.
// join() waits for the lane and adds its wait and traffic to the step's; what it threw comes
// back. undo() drops everything the lane wrote (the swapper's pending writes, the staging,
// the parameter store's uncommitted writes) and rewrites the compute copies it touched from
// their masters, still the committed ones; mark_kept() says a kept lane's work is the step's
// (nothing left to undo).
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <vector>

#include "engine/config.h"
#include "engine/engine.h"
#include "engine/grad_reducer.h"
#include "engine/host_lane.h"
#include "engine/layout.h"
#include "engine/optimizer_lane.h"
#include "engine/optimizer_state.h"
#include "engine/shard_update.h"
#include "engine/step_bet.h"
#include "engine/step_tail.h"
#include "optim/grad_norm.h"
#include "optim/step_args.h"
#include "runtime/core/trace.h"
#include "runtime/device/device.h"

namespace strata::engine {

class LaneRun {
 public:
  struct Context {  // what the lane reads and updates and does not own
    const EngineConfig& cfg;
    const Layout& layout;
    int rank = 0;
    ShardUpdate& update;
    GradReducer& grads;  // the norms the bet is checked on, and the tail's accumulators
    OptimizerState& state;
    IoStats& io;  // the step's traffic and optimizer wait
    // Waits for the device stream's work and the NVMe parameter store's queue, logging (not
    // throwing) what failed.
    std::function<void()> settle;
    Tracer* tracer = nullptr;  // the host optimizer's spans, or null
  };
  struct Plan {
    offload::OptimizerSwapper::StepOrder order;  // the NVMe layers' swap indices
    bool deferred = false;     // each layer waits for publish() (else for its gradient, and the bet holds)
    bool tail = false;         // each stepped layer goes to the tail, which may ask for ascending order
    bool host_layers = false;  // then the host layers HostLane planned
  };

  explicit LaneRun(const Context& ctx)
      : c_(ctx),
        host_({.cfg = ctx.cfg,
               .layout = ctx.layout,
               .rank = ctx.rank,
               .state = ctx.state,
               .update = ctx.update,
               .tracer = ctx.tracer}),
        tail_({.rank = ctx.rank, .update = ctx.update, .grads = ctx.grads, .io = ctx.io}) {}
  LaneRun(const LaneRun&) = delete;
  LaneRun& operator=(const LaneRun&) = delete;

  void start(const Plan& plan, const StepBet& bet);
  void decide(bool keep);  // run()'s keep-or-undo, for a lane waiting to commit early
  void publish(const optim::StepArgs& args, float lr);
  void ready(int li, std::unique_ptr<device::Event> done) { lane_.ready(li, std::move(done)); }
  bool active() const noexcept { return lane_.active(); }
  void cancel() noexcept { lane_.cancel(); }
  std::exception_ptr join();
  bool abandoned() const noexcept { return abandoned_; }
  void undo() noexcept;
  void mark_kept() { touched_.assign(touched_.size(), 0); }
  HostLane& host() noexcept { return host_; }
  const HostLane& host() const noexcept { return host_; }
  StepTail& tail() noexcept { return tail_; }
  const StepTail& tail() const noexcept { return tail_; }

 private:
  void step_swapped_layers(const Plan& plan);  // on the lane
  void check_bet(int li);                      // on the lane, once layer li's gradient is in

  Context c_;
  HostLane host_;
  StepTail tail_;
  optim::StepArgs args_;  // the lane's arguments (read on the lane)
  float lr_ = 0.0f;
  double abandon_above_ = 0;   // this rank's squared norm above which the bet is lost
  optim::GradNorm partial_;    // this rank's squared norm over the layers the lane has taken
  bool abandoned_ = false;     // the lane stopped on a lost bet (not a failure)
  IoStats io_;                 // the lane's traffic, added to the step's after it joins
  std::vector<char> touched_;  // per layer: the lane updated it (written on the lane, read after join)
  OptimizerLane lane_;         // last: its destructor cancels and joins the thread before what it uses goes
};

}  // namespace strata::engine
