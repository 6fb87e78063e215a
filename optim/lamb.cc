// CPU LAMB (see lamb.h).
#include "optim/lamb.h"

#include <algorithm>
#include <cmath>

#include "runtime/core/dtype.h"
#include "runtime/core/error.h"

namespace strata::optim {

void validate(const LambConfig& c) {
  STRATA_CHECK(std::isfinite(c.lr) && c.lr >= 0, Errc::invalid_argument, "lamb: lr = ", c.lr, " must be >= 0");
  STRATA_CHECK(c.beta1 >= 0 && c.beta1 < 1 && c.beta2 >= 0 && c.beta2 < 1, Errc::invalid_argument, "lamb: betas = [",
               c.beta1, ", ", c.beta2, "] must lie in [0, 1)");
  STRATA_CHECK(c.eps > 0, Errc::invalid_argument, "lamb: eps = ", c.eps, " must be > 0");
  STRATA_CHECK(c.min_coeff > 0 && c.max_coeff >= c.min_coeff, Errc::invalid_argument, "lamb: min_coeff = ", c.min_coeff,
               " and max_coeff = ", c.max_coeff, " must satisfy 0 < min_coeff <= max_coeff");
}

float lamb_step(const LambConfig& c, const StepArgs& a, float* update) {
  validate(c);
  validate_step_args(a, {true, true}, "lamb step");
  STRATA_CHECK(a.grad_dtype == DType::fp32 && a.state_format == MomentFormat::fp32, Errc::invalid_argument,
               "lamb step: fp32 gradients and state only");
  const auto* g = static_cast<const float*>(a.grad);
  auto* m = static_cast<float*>(a.m);
  auto* v = static_cast<float*>(a.v);
  double w_sq = 0, u_sq = 0;
  for (std::size_t i = 0; i < a.n; ++i) {
    const float gi = g[i] * a.grad_scale;
    m[i] = c.beta1 * m[i] + (1.0f - c.beta1) * gi;
    v[i] = c.beta2 * v[i] + (1.0f - c.beta2) * gi * gi;
    update[i] = m[i] / (std::sqrt(v[i]) + c.eps) + c.weight_decay * a.master[i];
    w_sq += static_cast<double>(a.master[i]) * a.master[i];
    u_sq += static_cast<double>(update[i]) * update[i];
  }
  float ratio = 1.0f;
  if (w_sq > 0 && u_sq > 0) {
    ratio = std::clamp(static_cast<float>(std::sqrt(w_sq) / std::sqrt(u_sq)), c.min_coeff, c.max_coeff);
  }
  float step_size = c.lr;
  if (c.bias_correction) {
    const double t = static_cast<double>(a.step);
    step_size = static_cast<float>(c.lr * std::sqrt(1.0 - std::pow(c.beta2, t)) / (1.0 - std::pow(c.beta1, t)));
  }
  const float scale = step_size * ratio;
  for (std::size_t i = 0; i < a.n; ++i) a.master[i] -= scale * update[i];
  if (a.copy != nullptr) convert(a.master, DType::fp32, a.copy, a.copy_dtype, a.n);
  return ratio;
}

}  // namespace strata::optim
