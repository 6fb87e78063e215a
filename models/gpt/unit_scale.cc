// The unit-scaled GPT's scale factors (see unit_scale.h).
#include "models/gpt/unit_scale.h"

#include <cmath>

#include "models/gpt/config.h"

namespace strata::model {
namespace {

float rsqrt(double x) { return static_cast<float>(1.0 / std::sqrt(x)); }

// E[gelu(x)^2] for x ~ N(0,1), GELU's tanh form, by Simpson's rule over [-12, 12] (the
// integrand is below 1e-29 outside it).
double gelu_second_moment() {
  constexpr int kSteps = 24000;
  constexpr double a = -12.0, b = 12.0, h = (b - a) / kSteps;
  const double k = std::sqrt(2.0 / M_PI);
  auto f = [&](double x) {
    const double g = 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
    return g * g * std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI);
  };
  double s = f(a) + f(b);
  for (int i = 1; i < kSteps; ++i) s += (i % 2 == 1 ? 4.0 : 2.0) * f(a + i * h);
  return s * h / 3.0;
}

}  // namespace

UnitScales::UnitScales(const GptShape& s, int seq_len) {
  const double C = s.d_model;
  // QKV: fan-in C, fan-out 3C, but its input gradient keeps the forward scale (unit_scale.h).
  fwd_ = {rsqrt(C), rsqrt(C), rsqrt(C), rsqrt(4 * C)};
  grad_in_ = {rsqrt(C), rsqrt(C), rsqrt(4 * C), rsqrt(C)};
  head_fwd_ = rsqrt(C);
  head_grad_ = rsqrt(s.vocab);
  loss_grad_ = std::sqrt(static_cast<float>(s.vocab));
  double h = 0;
  for (int t = 1; t <= seq_len; ++t) h += 1.0 / t;
  attention_ = static_cast<float>(std::sqrt(seq_len / h));
  scores_ = kScoreTemperature * rsqrt(static_cast<double>(s.d_model) / s.heads);
}

ops::ProductScales UnitScales::product(int k, int rows) const noexcept {
  return {fwd_[static_cast<std::size_t>(k)], grad_in_[static_cast<std::size_t>(k)], rsqrt(rows)};
}

ops::ProductScales UnitScales::head() const noexcept { return {head_fwd_, head_grad_, head_grad_}; }

float UnitScales::embedding() noexcept { return rsqrt(2.0); }

float UnitScales::gelu() noexcept {
  static const float g = rsqrt(gelu_second_moment());
  return g;
}

float UnitScales::skip(int j) noexcept { return static_cast<float>(std::sqrt((j + 1.0) / (j + 2.0))); }
float UnitScales::branch(int j) noexcept { return rsqrt(j + 2.0); }

}  // namespace strata::model
