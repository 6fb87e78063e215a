// CPU LAMB (You et al. 2020, "Large Batch Optimization for Deep Learning"), with DeepSpeed's
// FusedLamb arithmetic: Adam's moments, then each tensor's update scaled by a trust ratio of
// norms, so it works on whole tensors only (the engine runs it at ZeRO stage 0, where every
// rank holds every tensor whole).
//
// Per tensor: m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;  u = m / (sqrt(v) + eps) + wd p;
// ratio = ||p|| / ||u|| clamped to [min_coeff, max_coeff] (1 when either norm is 0);
// p -= step_size * ratio * u, with step_size = lr sqrt(1 - b2^t) / (1 - b1^t) under bias
// correction, else lr. Norms are summed in double in element order, so the result does not
// depend on threads.
#pragma once

#include "optim/step_args.h"

namespace strata::optim {

struct LambConfig {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  bool bias_correction = true;
  float max_coeff = 10.0f;
  float min_coeff = 0.01f;
};

void validate(const LambConfig& config);

// One whole tensor of args.n elements (fp32 gradient and state; args.copy optional).
// `update` is scratch for n floats. Returns the trust ratio applied.
float lamb_step(const LambConfig& config, const StepArgs& args, float* update);

}  // namespace strata::optim
