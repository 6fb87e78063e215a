// Overflow check, loss-scale update and clipping folded into one StepPlan (see step_plan.h).
#include "optim/step_plan.h"

#include <cmath>

#include "optim/clip.h"

namespace strata::optim {

StepPlan plan_step(const GradNorm& global, LossScaler& scaler, double max_norm) {
  StepPlan plan;
  plan.loss_scale = scaler.scale();
  plan.grad_norm = std::sqrt(global.sumsq) / plan.loss_scale;
  plan.skip = scaler.update(!global.finite);
  if (plan.skip) return plan;
  plan.clip_coef = clip_coefficient(plan.grad_norm, max_norm);
  plan.grad_scale = static_cast<float>(plan.clip_coef / plan.loss_scale);
  return plan;
}

}  // namespace strata::optim
