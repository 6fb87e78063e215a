// The decision between the gradient norm pass and the optimizer pass: skip or not, and the
// single multiplier (clip coefficient / loss scale) the optimizer applies as it reads the
// gradient. This is what the engine's step() does once the shards' GradNorms are combined.
#pragma once

#include "optim/grad_norm.h"
#include "optim/loss_scaler.h"

namespace strata::optim {

struct StepPlan {
  bool skip = false;        // overflow: do not run the optimizer (state stays untouched)
  float grad_scale = 1.0f;  // StepArgs::grad_scale for every shard of this step
  double grad_norm = 0.0;   // global norm of the unscaled gradient (NaN/inf on overflow)
  double loss_scale = 1.0;  // the scale the gradients carry (before the scaler's update)
  double clip_coef = 1.0;
};

// `global` is the GradNorm of the whole (scaled) gradient, summed over shards and ranks in a
// fixed order. Calls scaler.update() exactly once. max_norm <= 0: no clipping.
StepPlan plan_step(const GradNorm& global, LossScaler& scaler, double max_norm);

}  // namespace strata::optim
