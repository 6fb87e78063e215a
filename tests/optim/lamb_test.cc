// LAMB against a double-precision reference of DeepSpeed's FusedLamb arithmetic over 20
// steps, with and without bias correction and weight decay; the trust ratio's clamps and its
// value of 1 when a norm is zero; the bf16 compute copy.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "optim/lamb.h"
#include "runtime/core/dtype.h"

using namespace strata;

namespace {

optim::StepArgs args_for(std::vector<float>& w, std::vector<float>& g, std::vector<float>& m, std::vector<float>& v) {
  optim::StepArgs a;
  a.master = w.data();
  a.grad = g.data();
  a.m = m.data();
  a.v = v.data();
  a.n = w.size();
  return a;
}

}  // namespace

TEST_CASE("LAMB matches a double reference at every one of 20 steps", "[optim]") {
  const bool bias = GENERATE(true, false);
  const float wd = GENERATE(0.0f, 0.01f);
  CAPTURE(bias, wd);
  constexpr std::size_t n = 1000;
  optim::LambConfig cfg;
  cfg.lr = 1e-2f;
  cfg.weight_decay = wd;
  cfg.bias_correction = bias;
  cfg.max_coeff = 0.3f;  // the collected BERT config's clamps
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> w(n), m(n, 0.0f), v(n, 0.0f), g(n), u(n);
  std::vector<double> wd_(n), md(n, 0.0), vd(n, 0.0);
  for (std::size_t i = 0; i < n; ++i) wd_[i] = w[i] = 0.1f * dist(rng);
  for (std::int64_t step = 1; step <= 20; ++step) {
    for (auto& x : g) x = dist(rng);
    const float scale = 0.5f;
    optim::StepArgs a = args_for(w, g, m, v);
    a.grad_scale = scale;
    a.step = step;
    const float ratio = optim::lamb_step(cfg, a, u.data());
    // The reference in double.
    std::vector<double> ud(n);
    double w2 = 0, u2 = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const double gi = static_cast<double>(g[i]) * scale;
      md[i] = cfg.beta1 * md[i] + (1.0 - cfg.beta1) * gi;
      vd[i] = cfg.beta2 * vd[i] + (1.0 - cfg.beta2) * gi * gi;
      ud[i] = md[i] / (std::sqrt(vd[i]) + cfg.eps) + wd * wd_[i];
      w2 += wd_[i] * wd_[i];
      u2 += ud[i] * ud[i];
    }
    const double rd = std::clamp(std::sqrt(w2) / std::sqrt(u2), double{cfg.min_coeff}, double{cfg.max_coeff});
    const double t = static_cast<double>(step);
    const double step_size =
        bias ? cfg.lr * std::sqrt(1 - std::pow(double{cfg.beta2}, t)) / (1 - std::pow(double{cfg.beta1}, t)) : cfg.lr;
    double worst = 0, top = 0;
    for (std::size_t i = 0; i < n; ++i) {
      wd_[i] -= step_size * rd * ud[i];
      worst = std::max(worst, std::abs(w[i] - wd_[i]));
      top = std::max(top, std::abs(wd_[i]));
    }
    INFO("step " << step << ": ratio " << ratio << " against " << rd << ", worst " << worst << " of " << top);
    REQUIRE(std::abs(ratio - rd) <= 1e-5 * rd);
    REQUIRE(worst <= 2e-5 * top);
  }
}

TEST_CASE("LAMB's trust ratio is clamped, and 1 when a norm is zero; the bf16 copy is written", "[optim]") {
  constexpr std::size_t n = 64;
  std::vector<float> w(n, 1.0f), m(n, 0.0f), v(n, 0.0f), g(n, 1e-3f), u(n);
  std::vector<std::uint16_t> copy(n);
  optim::LambConfig cfg;
  optim::StepArgs a = args_for(w, g, m, v);
  a.copy = copy.data();
  a.copy_dtype = DType::bf16;
  // The first update without bias correction in u: 0.1 g / sqrt(0.001 g^2) = sqrt(10) per
  // element, so ||u|| / ||w|| = sqrt(10) and the ratio is 1 / sqrt(10) (eps, against
  // sqrt(v) = 3e-5, moves it by 3e-4).
  CHECK(optim::lamb_step(cfg, a, u.data()) == Approx(1.0 / std::sqrt(10.0)).epsilon(1e-3));
  std::vector<float> back(n);
  convert(copy.data(), DType::bf16, back.data(), DType::fp32, n);
  CHECK(back[0] == Approx(w[0]).epsilon(1e-2));
  std::fill(w.begin(), w.end(), 1000.0f);  // a huge weight norm: the ratio clamps to max_coeff
  CHECK(optim::lamb_step(cfg, a, u.data()) == cfg.max_coeff);
  std::fill(w.begin(), w.end(), 1e-9f);  // a tiny one: min_coeff
  CHECK(optim::lamb_step(cfg, a, u.data()) == cfg.min_coeff);
  std::fill(w.begin(), w.end(), 0.0f);  // a zero weight norm: ratio 1
  CHECK(optim::lamb_step(cfg, a, u.data()) == 1.0f);
}
