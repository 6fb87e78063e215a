// StepScalars: the scalars of an optimizer step (docs/design.md, "The engine's parts"): the
// global gradient norm, the loss scaler and gradient clipping that turn it into the step's
// plan, the learning rate, and the step counters a checkpoint saves.
//
// Protocol. plan() counts a step() call and reads every layer's accumulator (the caller has
// synchronized the reductions): it sums this rank's squared gradient norm over its shard of
// every bucket in bucket order, on the side that holds the accumulator, and combines the
// ranks' sums in rank order (with pipeline stages, every stage's buckets in layer-id order
// first), so every stage, rank and world sees the same bits; then it averages over ranks and
// micro-batches and asks the loss scaler and gradient clipping for the plan (an overflow moves
// the scaler). args(plan) are the optimizer's arguments for it but the learning rate, which is
// next_lr(); taken() counts the step once its update has run. A step that fails after plan()
// puts the scaler back with restore_scaler(scaler_state() from before plan()): only the call
// counts. The overlapped step speculates with bet() (step_bet.h): the plan of a step that
// neither overflows nor clips, and the bound on this rank's part of the norm it stops above.
#pragma once

#include <cstdint>

#include "engine/config.h"
#include "engine/grad_reducer.h"
#include "engine/layout.h"
#include "engine/step_bet.h"
#include "optim/grad_norm.h"
#include "optim/loss_scaler.h"
#include "optim/step_args.h"
#include "optim/step_plan.h"
#include "runtime/comm/communicator.h"

namespace strata::engine {

class StepScalars {
 public:
  struct Context {  // what the scalars read and do not own
    const EngineConfig& cfg;
    const Layout& layout;
    int world = 1;
    DType cdt = DType::fp32;
    comm::Communicator* comm = nullptr;      // null: one rank
    comm::Communicator* pipeline = nullptr;  // EngineOptions::pipeline_comm, or null
    const GradReducer& grads;                // the accumulators' norms
  };
  // What a checkpoint saves and restores.
  struct Counters {
    std::int64_t steps_taken = 0;  // steps the optimizer ran (the schedule's and Adam's step)
    std::int64_t step_calls = 0;   // step() calls, skipped ones included
    optim::LossScaler::State scaler;
  };

  StepScalars(const Context& ctx, const optim::LossScalerConfig& scaler) : c_(ctx), scaler_(scaler) {}
  StepScalars(const StepScalars&) = delete;
  StepScalars& operator=(const StepScalars&) = delete;

  optim::StepPlan plan();
  StepBet bet() const;  // at clip coefficient 1, the current loss scale and the next learning rate
  optim::StepArgs args(const optim::StepPlan& plan) const;
  float next_lr() const { return scheduled_lr(c_.cfg, taken_ + 1); }
  void taken() noexcept { ++taken_; }
  std::int64_t steps_taken() const noexcept { return taken_; }
  std::int64_t calls() const noexcept { return calls_; }
  // Ranks x micro-batches: what the summed gradients are divided by.
  double averaging() const;
  double loss_scale() const noexcept { return scaler_.scale(); }
  const optim::LossScalerConfig& scaler_config() const noexcept { return scaler_.config(); }  // as the engine was made
  optim::LossScaler::State scaler_state() const noexcept { return scaler_.state(); }
  void restore_scaler(const optim::LossScaler::State& s) { scaler_.restore(s); }
  Counters counters() const noexcept { return {taken_, calls_, scaler_.state()}; }
  void restore(const Counters& c);

 private:
  optim::GradNorm global_grad_norm() const;
  // This rank's share of the norm over every pipeline stage's layers (Context::pipeline).
  optim::GradNorm pipeline_norm() const;

  Context c_;
  optim::LossScaler scaler_;
  std::int64_t taken_ = 0;
  std::int64_t calls_ = 0;
};

}  // namespace strata::engine
