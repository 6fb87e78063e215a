// CPU Adagrad (torch.optim.Adagrad; DeepSpeed ships it as cpu_adagrad): a running sum of
// squared gradients (StepArgs::v) scales each step. Same fused pass and scaffolding as adam.h.
#pragma once

#include "optim/detail/update_scalars.h"
#include "optim/param_groups.h"
#include "optim/step_args.h"

namespace strata::optim {

// Per element: g += wd*p (L2, when weight_decay > 0);  v += g*g;
// p -= clr * g / (sqrt(v) + eps), clr = lr / (1 + (step - 1) * lr_decay).
// torch's initial_accumulator_value is the caller's initial fill of v.
struct AdagradConfig {
  float lr = 1e-2f;
  float lr_decay = 0.0f;
  float eps = 1e-10f;
  float weight_decay = 0.0f;
};

void validate(const AdagradConfig& config);

// Uses StepArgs::v (m is ignored).
void adagrad_step(const AdagradConfig& config, const StepArgs& args, const StepOptions& options = {});

class Adagrad {
 public:
  explicit Adagrad(const AdagradConfig& defaults = {}, const StepOptions& options = {});
  ParamGroups<AdagradConfig>& groups() noexcept { return groups_; }
  const ParamGroups<AdagradConfig>& groups() const noexcept { return groups_; }
  void step(const StepArgs& args, int group = 0) const { adagrad_step(groups_.get(group), args, options_); }

 private:
  ParamGroups<AdagradConfig> groups_;
  StepOptions options_;
};

namespace detail {
AdagradScalars adagrad_scalars(const AdagradConfig& config, std::int64_t step, float grad_scale);
}  // namespace detail

}  // namespace strata::optim
