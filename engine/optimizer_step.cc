// OptimizerStep (the protocol in optimizer_step.h): the step over its parts, the optimizer on
// every shard wherever it lives (resident layers, or the NVMe swapper's sub-groups), and the
// rollback of an update that fails halfway.
#include "engine/optimizer_step.h"

#include <exception>

#include "engine/config.h"
#include "runtime/core/error.h"
#include "runtime/core/log.h"

namespace strata::engine {

void OptimizerStep::begin(bool allowed) { c_.overlap.begin(allowed, c_.scalars.bet()); }

StepResult OptimizerStep::run() {
  c_.overlap.before_step();
  StepScalars& scalars = c_.scalars;
  const optim::LossScaler::State scaler_before = scalars.scaler_state();
  optim::StepPlan plan;
  try {
    plan = scalars.plan();
  } catch (...) {
    c_.overlap.cancel();
    throw;
  }
  StepResult result;
  result.skipped = plan.skip;
  result.grad_norm = plan.grad_norm;
  result.loss_scale = plan.loss_scale;
  result.clip_coef = plan.clip_coef;
  try {
    const OverlappedStep::Outcome lane = c_.overlap.settle(plan, scalars.args(plan), scalars.next_lr());
    result.rolled_back = lane.rolled_back;
    result.tail_layers = lane.tail_layers;
    result.deferred = lane.deferred;
  } catch (...) {
    scalars.restore_scaler(scaler_before);  // the failed step counts for nothing but the call
    throw;
  }
  if (!plan.skip) {
    result.lr = scalars.next_lr();
    try {
      run_optimizer(scalars.args(plan), result.lr);
    } catch (...) {
      scalars.restore_scaler(scaler_before);  // the failed step counts for nothing but the call
      throw;
    }
    scalars.taken();
  } else {
    STRATA_LOG(info, "rank ", c_.rank, ": step skipped: gradient overflow at loss scale ", plan.loss_scale,
               " (next scale ", scalars.loss_scale(), ")");
  }
  result.step = scalars.steps_taken();
  return result;
}

void OptimizerStep::run_optimizer(const optim::StepArgs& base, float lr) {
  try {
    if (c_.cfg.optimizer.type == OptimizerType::lamb) {
      c_.update.lamb(base, lr);
      return;
    }
    if (c_.cfg.optimizer.type == OptimizerType::muon && c_.cfg.zero.stage == 0) {
      c_.update.muon(base, lr);
      return;
    }
    if (c_.cfg.optimizer.type == OptimizerType::muon) {  // stages 1-3: the NVMe layers first, then the rest
      c_.update.muon_sharded(base, lr, c_.io);
      c_.update.commit();
      return;
    }
    if (!c_.overlap.tail()) c_.update.swapped(base, lr, c_.io);   // a tail steps and commits them itself
    c_.update.resident(base, lr, c_.overlap.kept_host_layers());  // the lane's kept host layers are done
    c_.update.commit();
  } catch (...) {
    if (c_.overlap.tail()) {  // the tail uses the staging and the store that roll_back() drops: it ends first
      try {
        c_.overlap.finish_tail();
      } catch (const std::exception& e) {
        STRATA_LOG(error, e.what());
      }
    }
    roll_back();
    throw;
  }
}

void OptimizerStep::roll_back() noexcept {
  // Device work and parameter write-backs already queued may still read or write the
  // buffers dropped below: let them finish.
  c_.settle();
  // Staged copies are dropped and the NVMe shards' uncommitted writes too. The last good
  // shards stay current, but for a layer whose write had begun to commit (the store's spare
  // files in use): it is rebuilt from the committed masters, or left refused.
  c_.update.abort();
  c_.update.rebuild_stale_shards();
}

}  // namespace strata::engine
