// OverlappedStep (the protocol in overlapped_step.h): when the lane runs and on what, the
// keep-or-undo decision, the deferred step, and the tail that finishes a kept step while the
// next forward runs.
#include "engine/overlapped_step.h"

#include <exception>

#include "runtime/core/error.h"
#include "runtime/core/log.h"

namespace strata::engine {

// The lane steps the swapped layers, or the host layers, in backward order on the plan of a
// step that neither overflows nor clips; run() keeps its work only when the real plan is that
// one. When the last step clipped and this one may end as a tail, the lane bets on nothing:
// it is deferred (start_deferred()).
void OverlappedStep::begin(bool allowed, const StepBet& bet) {
  if (run_.tail().running()) {  // the last step's tail still runs: this step's lane starts when it ends
    armed_ = allowed ? 1 : 0;
    armed_bet_ = bet;
    return;
  }
  const bool swapped = c_.state.has_swapped();
  if (run_.active()) run_.undo();  // a step abandoned before run(): never kept
  deferred_ = false;
  if (!allowed || !c_.cfg.offload_optimizer.overlap_step || c_.cfg.optimizer.type == OptimizerType::lamb ||
      c_.cfg.optimizer.type == OptimizerType::muon)
    return;
  run_.host().plan(swapped);
  if (!swapped && run_.host().empty()) return;
  run_.tail().check();
  // A kept step may finish as a tail (stage 3, every layer's state on NVMe, none persistent:
  // then nothing else in step() touches what the lane updates).
  bool tail_ok = c_.cfg.zero.stage == 3;
  for (std::size_t li = 0; li < c_.layout.layers().size() && tail_ok; ++li)
    tail_ok = c_.state.tier(static_cast<int>(li)) == Tier::nvme && !c_.update.replicated(static_cast<int>(li));
  tail_ok_ = tail_ok;
  if (tail_ok && swapped && c_.cfg.gradient_clipping > 0 && clipped_last_) {
    start_deferred();
    return;
  }
  // The bet is lost early when this rank's part of the squared norm already overflows or
  // exceeds the clipping threshold (the global sum can only be larger): the lane stops and
  // the step runs synchronously, without first finishing work it would undo.
  speculated_scale_ = bet.grad_scale;
  LaneRun::Plan plan{.tail = tail_ok, .host_layers = true};
  for (std::size_t t = c_.state.swapped_layers(); t-- > 0;)
    plan.order.tensors.push_back(t);  // backward: last layer first
  plan.order.defer_commit = true;
  run_.start(plan, bet);
}

// A deferred step's lane: the swapper's step starts now, its reads running ahead lowest layer
// first (the order the tail steps in and the next forward gathers in: it needs no gradient
// before the plan), and its first update waits at the lane's plan gate until publish_plan()
// gives it the step's arguments; then it finishes the step as the tail. Bets on nothing, so
// nothing is ever undone.
void OverlappedStep::start_deferred() {
  LaneRun::Plan plan{.deferred = true, .tail = true};
  for (std::size_t t = 0; t < c_.state.swapped_layers(); ++t) plan.order.tensors.push_back(t);
  plan.order.defer_commit = true;
  deferred_ = true;
  run_.start(plan, StepBet{});
}

// run()'s plan for a deferred lane: its arguments (those the synchronous step would use), then
// the gate. The lane is kept from here on: it finishes the step as the tail. False, publishing
// nothing, when the lane has already ended (it failed reading ahead).
bool OverlappedStep::publish_plan(const optim::StepArgs& args, float lr) {
  if (!run_.tail().keep(nullptr)) return false;
  run_.publish(args, lr);
  return true;
}

void OverlappedStep::layer_done(int li, std::unique_ptr<device::Event> done) {
  if (run_.tail().running()) finish_tail();  // a layer the next forward never gathered: the tail must end first
  run_.ready(li, std::move(done));
}

void OverlappedStep::before_step() {
  // The last step's tail, when the trainer touched no layer it had left: this step's lane was
  // never started (nothing handed it a layer), so the step runs synchronously.
  armed_ = -1;
  finish_tail();
}

OverlappedStep::Outcome OverlappedStep::settle(const optim::StepPlan& plan, const optim::StepArgs& args, float lr) {
  Outcome out;
  out.rolled_back = !finish_overlap(plan, args, lr);
  StepTail& tail = run_.tail();
  out.tail_layers = tail.running() ? tail.layers_left() : 0;
  out.deferred = deferred_ && tail.running() && !out.rolled_back;
  if (out.rolled_back) {
    STRATA_LOG(info, "rank ", c_.rank, ": the overlapped optimizer step was undone (",
               plan.skip ? "gradient overflow" : "gradient clipping", "); the step runs ",
               tail.running() ? "as the tail, during the next forward" : "synchronously");
  }
  if (!plan.skip) clipped_last_ = plan.clip_coef < 1.0;
  return out;
}

bool OverlappedStep::finish_overlap(const optim::StepPlan& plan, const optim::StepArgs& args, float lr) {
  run_.host().clear_kept();
  if (!run_.active()) return true;
  if (deferred_) {
    if (!plan.skip && publish_plan(args, lr)) return true;
    // Skipped (nothing was stepped: the lane stops at its gate, and what it read ahead
    // counts), or the lane failed while it read ahead.
    if (plan.skip) run_.cancel();
    const std::exception_ptr failed = run_.join();
    run_.undo();
    if (failed) std::rethrow_exception(failed);
    return true;
  }
  const bool same = !plan.skip && plan.grad_scale == speculated_scale_;  // the same update, bit for bit
  run_.decide(same);  // a lane waiting for the decision before it commits early goes on, or stops
  // Kept, and the lane is still at work: it finishes the step as the tail, lowest layer
  // first, while the next forward runs. What it wrote so far commits behind its writes.
  if (same && tail_ok_ && run_.tail().keep([this] { c_.update.commit(); })) return true;
  const std::exception_ptr failed = run_.join();
  if (failed) {
    run_.undo();
    if (!run_.abandoned()) std::rethrow_exception(failed);
    redo_as_tail(plan, args, lr);
    return false;  // a lost bet: the step runs as the tail, or synchronously (it is skipped or clipped)
  }
  if (same) {
    run_.host().keep();  // the host layers' new state becomes theirs; run() steps the layers the lane did not
    return true;
  }
  run_.undo();
  redo_as_tail(plan, args, lr);
  return false;
}

// A lost bet whose step may end as a tail: the real step runs as one (lowest layer first,
// while the next forward runs) rather than synchronously in run().
void OverlappedStep::redo_as_tail(const optim::StepPlan& plan, const optim::StepArgs& args, float lr) {
  if (plan.skip || !tail_ok_ || !c_.state.has_swapped()) return;
  start_deferred();
  if (publish_plan(args, lr)) return;
  // The fresh lane already failed (reading ahead): its error is the step's.
  const std::exception_ptr failed = run_.join();
  run_.undo();
  if (failed) std::rethrow_exception(failed);
}

void OverlappedStep::before_layer(int li) {
  if (!run_.tail().running()) return;
  // Once the lane is over: join it, count its traffic, start the lane begin_step armed.
  if (run_.tail().wait_for(li)) finish_tail();
}

void OverlappedStep::finish_tail() {
  StepTail& tail = run_.tail();
  if (!tail.stop()) return;
  const std::exception_ptr failed = run_.join();
  run_.mark_kept();
  tail.finish();
  if (failed) {
    armed_ = -1;
    tail.failed(failed);
  }
  if (armed_ >= 0) {
    const bool allowed = armed_ == 1;
    armed_ = -1;
    begin(allowed, armed_bet_);
  }
}

void OverlappedStep::zero_grads() { run_.tail().zero_grads(); }

void OverlappedStep::cancel() noexcept {
  armed_ = -1;
  if (run_.tail().running()) {
    try {
      finish_tail();  // a kept step: let it finish
    } catch (const std::exception& e) {
      STRATA_LOG(error, e.what());
    }
    return;
  }
  if (run_.active()) run_.undo();
}

}  // namespace strata::engine
