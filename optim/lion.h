// CPU Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"; DeepSpeed ships
// it as cpu_lion): the sign of an interpolated momentum as the update, one state buffer (m).
// Same fused pass and scaffolding as adam.h.
#pragma once

#include "optim/detail/update_scalars.h"
#include "optim/param_groups.h"
#include "optim/step_args.h"

namespace strata::optim {

// Per element: c = beta1*m + (1-beta1)*g;  p = p*(1 - lr*wd) - lr*sign(c)  (sign(0) = 0);
// m = beta2*m + (1-beta2)*g.
struct LionConfig {
  float lr = 1e-4f;
  float beta1 = 0.9f;
  float beta2 = 0.99f;
  float weight_decay = 0.0f;
};

void validate(const LionConfig& config);

// Uses StepArgs::m (v is ignored).
void lion_step(const LionConfig& config, const StepArgs& args, const StepOptions& options = {});

class Lion {
 public:
  explicit Lion(const LionConfig& defaults = {}, const StepOptions& options = {});
  ParamGroups<LionConfig>& groups() noexcept { return groups_; }
  const ParamGroups<LionConfig>& groups() const noexcept { return groups_; }
  void step(const StepArgs& args, int group = 0) const { lion_step(groups_.get(group), args, options_); }

 private:
  ParamGroups<LionConfig> groups_;
  StepOptions options_;
};

namespace detail {
LionScalars lion_scalars(const LionConfig& config, float grad_scale);
}  // namespace detail

}  // namespace strata::optim
