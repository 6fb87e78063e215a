// CPU Adam and AdamW: one fused, memory-bound pass per shard (reads master, grad, m, v; writes
// master, m, v and optionally the bf16/fp16 copy), xsimd-vectorised at the widest ISA the
// build targets and split over TBB. The arithmetic is spelled out in detail/update_scalars.h;
// the CUDA kernel (device_step.h) runs the same operations.
#pragma once

#include "optim/detail/update_scalars.h"
#include "optim/param_groups.h"
#include "optim/step_args.h"

namespace strata::optim {

// torch.optim.AdamW / DeepSpeedCPUAdam hyperparameters. adamw_mode: decoupled weight decay
// (p *= 1 - lr * weight_decay); off: Adam with L2 decay (g += weight_decay * p).
struct AdamConfig {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;
  bool adamw_mode = true;
  bool bias_correction = true;
};

// Throws Errc::invalid_argument naming the field: lr >= 0, betas in [0, 1), eps > 0,
// weight_decay >= 0, all finite.
void validate(const AdamConfig& config);

// Uses StepArgs::m and ::v. Validates, then updates the shard; bitwise identical for any
// thread count (the caller's TBB arena) and StepOptions::block_elems.
void adam_step(const AdamConfig& config, const StepArgs& args, const StepOptions& options = {});

// The optimizer the engine holds: hyperparameters per parameter group.
class AdamW {
 public:
  explicit AdamW(const AdamConfig& defaults = {}, const StepOptions& options = {});
  ParamGroups<AdamConfig>& groups() noexcept { return groups_; }
  const ParamGroups<AdamConfig>& groups() const noexcept { return groups_; }
  void step(const StepArgs& args, int group = 0) const { adam_step(groups_.get(group), args, options_); }

 private:
  ParamGroups<AdamConfig> groups_;
  StepOptions options_;
};

namespace detail {
// The constants of one step (shared by the CPU and CUDA kernels).
AdamScalars adam_scalars(const AdamConfig& config, std::int64_t step, float grad_scale);
}  // namespace detail

}  // namespace strata::optim
