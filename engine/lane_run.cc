// LaneRun (the protocol in lane_run.h): the overlapped step's lane at work, its bet, its
// traffic and its undo.
#include "engine/lane_run.h"

#include <algorithm>
#include <chrono>

#include "runtime/core/error.h"
#include "runtime/core/log.h"

namespace strata::engine {

void LaneRun::start(const Plan& plan, const StepBet& bet) {
  args_ = bet.args;
  lr_ = bet.lr;
  abandon_above_ = bet.abandon_above;
  partial_ = {};
  abandoned_ = false;
  tail_.arm(c_.layout.layers().size());
  touched_.assign(c_.layout.layers().size(), 0);
  io_ = {};
  lane_.start(c_.layout.layers().size(), [this, plan] {
    std::exception_ptr failed;
    try {
      if (c_.state.has_swapped()) step_swapped_layers(plan);
      if (plan.host_layers)
        host_.step(args_, lr_, [this](int li) {
          lane_.wait_ready(li);
          check_bet(li);
          touched_[static_cast<std::size_t>(li)] = 1;
        });
    } catch (...) {
      failed = std::current_exception();
    }
    tail_.lane_ended(failed != nullptr, [this] { c_.state.commit_pending(); });
    if (failed) std::rethrow_exception(failed);
  });
  // The lane reaches the staging only past a gate that this thread opens later (ready(), or
  // publish()).
  c_.update.count_into(&io_);
}

void LaneRun::decide(bool keep) { lane_.decide(keep); }

void LaneRun::publish(const optim::StepArgs& args, float lr) {
  args_ = args;  // the lane reads them only past the gate
  lr_ = lr;
  lane_.open_plan();
}

// On the lane: the swapper's step, pulled a sub-group at a time. Before a layer's first
// sub-group the lane waits for its gradient and checks the bet (or, deferred, for the plan);
// the reads of that layer and the next run ahead meanwhile. After a layer's last one, the tail
// hears of it; once the tail asks, the layers not yet begun are visited lowest first.
void LaneRun::step_swapped_layers(const Plan& plan) {
  auto step = c_.state.begin_swapped(plan.order);
  for (;;) {
    if (plan.tail && tail_.ascending()->load(std::memory_order_acquire)) step.ascending_rest();
    const auto next = step.peek();
    if (!next) break;
    const int li = c_.state.swapped_layer(next->tensor);
    if (next->first && plan.deferred) {
      lane_.wait_plan();
      step.allow_commit();  // a deferred lane bets on nothing: kept from its plan on
    } else if (next->first) {
      lane_.wait_ready(li);
      check_bet(li);
    }
    if (!step.room()) {  // the swapper's spares for this sub-group's length are all lent: commits must begin
      if (!lane_.wait_decision()) {
        abandoned_ = true;
        throw Error(Errc::internal, "overlapped optimizer step abandoned: it is undone");
      }
      step.allow_commit();
    }
    const offload::SubGroup g = step.take();
    touched_[static_cast<std::size_t>(li)] = 1;
    c_.update.sub_group(args_, lr_, li, g);
    step.put();
    if (next->last && plan.tail) tail_.layer_stepped(li);
  }
  step.finish();
}

void LaneRun::check_bet(int li) {
  // run() decided to keep the step: the rest is the tail, or work it keeps (its sub-groups may
  // have begun to commit, so a partial norm summed in another order must not abandon it now).
  if (tail_.kept() || lane_.kept()) return;
  c_.grads.add_shard_norm(li, partial_);
  if (partial_.finite && partial_.sumsq <= abandon_above_) return;
  abandoned_ = true;
  throw Error(Errc::internal, "overlapped optimizer step abandoned: the gradient overflows or is clipped");
}

std::exception_ptr LaneRun::join() {
  std::exception_ptr failed;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    lane_.join();
  } catch (...) {
    failed = std::current_exception();
  }
  c_.io.optimizer_wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  c_.update.count_into(nullptr);
  c_.state.add_swap_traffic(io_);
  c_.io += io_;
  io_ = {};
  return failed;
}

// Nothing the lane wrote survives: the swapper's pending writes, the host layers' spare
// arrays (HostLane::keep() never ran) and the parameter store's uncommitted writes are dropped,
// and compute copies it rewrote in place (and NVMe shards it had begun to commit) are rebuilt
// from the masters, which are still the last committed ones.
void LaneRun::undo() noexcept {
  lane_.cancel();
  c_.update.count_into(nullptr);
  if (c_.state.has_swapped())
    c_.state.discard_pending();
  else if (std::find(touched_.begin(), touched_.end(), 1) == touched_.end())
    return;  // host layers only, none written yet
  c_.settle();
  c_.update.abort();
  try {
    for (std::size_t li = 0; li < touched_.size(); ++li)
      if (touched_[li] != 0) c_.update.restore_copies(static_cast<int>(li));
  } catch (const std::exception& e) {
    STRATA_LOG(error, "rank ", c_.rank, ": undoing the overlapped optimizer step failed: ", e.what(),
               "; the compute copies may hold the undone update: resume from a checkpoint");
  }
  touched_.assign(touched_.size(), 0);
}

}  // namespace strata::engine
