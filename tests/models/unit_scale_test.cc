// The unit-scaled GPT's ops at initialisation (models/gpt/unit_scale.h): each scaled op maps
// unit-variance inputs to a unit second moment, checked on sampled tensors against bounds
// derived from the sampling error of the estimate (6 standard deviations: a false failure is
// below 1e-8 per check). Whole-model numerics (every gradient right up to one constant per
// tensor, training against torch) are the PyTorch oracle's (gpt_oracle_test.py).
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "models/gpt/array_access.h"
#include "models/gpt/config.h"
#include "models/gpt/ops.h"
#include "models/gpt/pass.h"
#include "models/gpt/unit_scale.h"
#include "runtime/device/device.h"

using namespace strata;
using namespace strata::model;

namespace {

std::vector<float> gaussian(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

double second_moment(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * x;
  return s / static_cast<double>(v.size());
}

// y = sum of K products a b of independent unit normals over sqrt(K), on an R x Cc grid whose
// rows share a and columns share b: Var(y^2) = 2 + 6/K, and two entries in a row or a column
// have Cov(y^2, y'^2) = 2/K, so the mean of y^2 over the grid has variance
// (2 + 6/K + 2 (R + Cc - 2)/K) / (R Cc).
double product_sigma(double R, double Cc, double K) {
  return std::sqrt((2.0 + (6.0 + 2.0 * (R + Cc - 2)) / K) / (R * Cc));
}

}  // namespace

TEST_CASE("unit-scaled products have unit second moment forward and in both gradients", "[unit]") {
  const GptShape shape{6, 6, 192, 128, 256};
  const UnitScales u(shape, 128);
  const int N = 512, C = shape.d_model;
  struct Product {
    int k, IC, OC;
    double grad_in;  // the input gradient's expected second moment
  };
  // QKV keeps its forward scale on the input gradient (fan-out 3C over fan-in C: 3).
  for (const Product p :
       {Product{0, C, 3 * C, 3.0}, Product{1, C, C, 1.0}, Product{2, C, 4 * C, 1.0}, Product{3, 4 * C, C, 1.0}}) {
    INFO("block product " << p.k);
    const auto s = u.product(p.k, N);
    const auto x = gaussian(static_cast<std::size_t>(N) * p.IC, 1 + p.k);
    const auto w = gaussian(static_cast<std::size_t>(p.IC) * p.OC, 11 + p.k);
    const auto g = gaussian(static_cast<std::size_t>(N) * p.OC, 21 + p.k);
    std::vector<float> y(static_cast<std::size_t>(N) * p.OC), dx(x.size()), dw(w.size(), 0.0f);
    ops::matmul_forward(y.data(), x.data(), w.data(), nullptr, N, p.IC, p.OC, ops::Products::fp32, s);
    ops::matmul_backward(dx.data(), dw.data(), nullptr, g.data(), x.data(), w.data(), N, p.IC, p.OC, false,
                         ops::Products::fp32, s);
    CHECK(std::abs(second_moment(y) - 1.0) <= 6 * product_sigma(N, p.OC, p.IC));
    CHECK(std::abs(second_moment(dx) / p.grad_in - 1.0) <= 6 * product_sigma(N, p.IC, p.OC));
    CHECK(std::abs(second_moment(dw) - 1.0) <= 6 * product_sigma(p.IC, p.OC, N));
  }
  // The head: logits over sqrt(C); its input gradient over sqrt(V).
  const int V = shape.vocab;
  const auto x = gaussian(static_cast<std::size_t>(N) * C, 31), wte = gaussian(static_cast<std::size_t>(V) * C, 32),
             g = gaussian(static_cast<std::size_t>(N) * V, 33);
  std::vector<float> logits(g.size()), dx(x.size()), dw(wte.size(), 0.0f);
  ops::lm_head_forward(logits.data(), x.data(), wte.data(), N, C, V, ops::Products::fp32, u.head());
  ops::lm_head_backward(dx.data(), dw.data(), g.data(), x.data(), wte.data(), N, C, V, ops::Products::fp32, u.head());
  CHECK(std::abs(second_moment(logits) - 1.0) <= 6 * product_sigma(N, V, C));
  CHECK(std::abs(second_moment(dx) - 1.0) <= 6 * product_sigma(N, C, V));
  // The head's weight gradient takes the input gradient's scale (the tied wte's two uses must
  // carry one constant), 1/sqrt(V) rather than 1/sqrt(N): second moment N / V.
  CHECK(std::abs(second_moment(dw) * V / N - 1.0) <= 6 * product_sigma(V, C, N));
}

TEST_CASE("unit-scaled GELU has unit second moment on a unit normal", "[unit]") {
  const std::size_t n = 1 << 20;
  auto x = gaussian(n, 41);
  std::vector<float> y(n);
  ops::gelu_forward(y.data(), x.data(), n);
  ops::scale(y.data(), UnitScales::gelu(), n);
  double m = 0, m2 = 0;
  for (float v : y) {
    const double s = static_cast<double>(v) * v;
    m += s;
    m2 += s * s;
  }
  m /= n;
  const double sigma = std::sqrt((m2 / n - m * m) / n);
  CHECK(std::abs(m - 1.0) <= 6 * sigma);
  CHECK(UnitScales::gelu() == Approx(1.0 / std::sqrt(0.4252)).epsilon(2e-3));  // E[gelu(x)^2] = 0.4252 (tanh form)
}

TEST_CASE(
    "unit-scaled causal attention has unit second moment when attention is uniform, and near it at initialisation",
    "[unit]") {
  const int B = 2, T = 128, C = 96, NH = 3;
  const GptShape shape{1, NH, C, T, 256};
  const UnitScales u(shape, T);
  const std::size_t N = static_cast<std::size_t>(B) * T;
  auto run = [&](bool uniform) {
    auto qkv = gaussian(N * 3 * C, 51);
    if (uniform) {  // q = k = 0: every score equal, so row t averages values 0..t
      for (std::size_t r = 0; r < N; ++r)
        std::fill_n(qkv.begin() + static_cast<std::ptrdiff_t>(r * 3 * C), 2 * C, 0.0f);
    }
    std::vector<float> out(N * C), att(ops::attention_state_floats(B, T, C, NH));
    ops::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH, u.scores());
    ops::scale(out.data(), u.attention(), out.size());
    return second_moment(out);
  };
  // Row t's output is the mean of t + 1 unit normals: Cov(y_t, y_t') = 1 / (max(t, t') + 1);
  // over B x C independent columns the estimate's variance is a^4 / (T^2 B C) sum 2 Cov^2.
  const double a2 = static_cast<double>(u.attention()) * u.attention();
  double var = 0;
  for (int t = 0; t < T; ++t)
    for (int s = 0; s < T; ++s) var += 2.0 / std::pow(std::max(t, s) + 1.0, 2);
  var *= a2 * a2 / (static_cast<double>(T) * T * B * C);
  CHECK(std::abs(run(true) - 1.0) <= 6 * std::sqrt(var));
  // With unit q and k the scores have variance s2 = kScoreTemperature^2 and the softmax
  // concentrates a little (sum p^2 >= 1/n, about e^s2 / n for long rows, less for short ones):
  // the second moment lies between the uniform case's and e^s2 (1.065).
  const double s2 = static_cast<double>(UnitScales::kScoreTemperature) * UnitScales::kScoreTemperature;
  const double m = run(false);
  INFO("second moment " << m << " with scores of variance " << s2);
  CHECK(m >= 1.0 - 6 * std::sqrt(var));
  CHECK(m <= std::exp(s2) + 6 * std::sqrt(var));
}

TEST_CASE("the unit-scaled loss gradient has unit second moment for unit logits", "[unit]") {
  const int N = 2048, V = 256;
  const UnitScales u(GptShape{1, 1, 8, 8, V}, 8);
  auto logits = gaussian(static_cast<std::size_t>(N) * V, 61);
  std::vector<std::int32_t> targets(N);
  std::mt19937_64 rng(62);
  for (auto& t : targets) t = static_cast<std::int32_t>(rng() % V);
  // Expected per row: sum (p - onehot)^2 = 1 - 2 p_t + sum p^2; E[p_t] = 1/V (targets are
  // independent of the logits), and sum p^2 is read from the softmax itself.
  double sum_p2 = 0;
  for (int n = 0; n < N; ++n) {
    const float* z = logits.data() + static_cast<std::size_t>(n) * V;
    double total = 0, sq = 0;
    for (int v = 0; v < V; ++v) total += std::exp(static_cast<double>(z[v]));
    for (int v = 0; v < V; ++v) sq += std::pow(std::exp(static_cast<double>(z[v])) / total, 2);
    sum_p2 += sq / N;
  }
  std::vector<float> losses(N);
  ops::cross_entropy(logits.data(), losses.data(), targets.data(), N, V, u.loss_grad());
  double m = 0, m2 = 0;
  for (int n = 0; n < N; ++n) {
    double s = 0;
    for (int v = 0; v < V; ++v) s += std::pow(logits[static_cast<std::size_t>(n) * V + v], 2);
    m += s / V / N;
    m2 += s / V * s / V / N;
  }
  const double sigma = std::sqrt((m2 - m * m) / N);
  CHECK(std::abs(m - (1.0 - 2.0 / V + sum_p2)) <= 6 * sigma + 1e-6);
  CHECK(m == Approx(1.0).epsilon(0.05));
}

TEST_CASE("a unit-scaled GPT's weight gradients stay near unit, far inside fp16's range", "[unit]") {
  const GptShape shape{2, 6, 192, 128, 256};
  const int B = 4, T = 128;
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(B) * T), targets(tokens.size());
  std::mt19937_64 rng(71);
  for (auto& t : tokens) t = static_cast<std::int32_t>(rng() % 256);
  for (auto& t : targets) t = static_cast<std::int32_t>(rng() % 256);
  device::DeviceOptions d;
  d.budget_bytes = GptPass::device_bytes(shape, B, T, Remat::never) + (1 << 20);
  auto dev = device::Device::create(d);
  // Share of gradient elements fp16 holds only as subnormals or zero (below 2^-14), worst tensor.
  auto worst_subnormal_share = [&](bool unit) {
    auto params = ArrayAccess::by_layer(shape, gpt_initial_params(shape, 5, unit));
    ArrayAccess access(params);
    GptPass pass(shape, B, T, Remat::never, *dev, ops::Products::fp32, {}, unit);
    pass.train(access, tokens.data(), targets.data(), B, T, 1.0f);
    double worst = 0;
    for (const auto& g : access.all_grads()) {
      if (g.name.find(".weight") == std::string::npos || g.name.find("ln_") != std::string::npos) continue;
      std::size_t small = 0;
      for (float v : g.data) small += std::abs(v) < std::ldexp(1.0f, -14) ? 1 : 0;
      const double share = static_cast<double>(small) / static_cast<double>(g.data.size());
      INFO(g.name << (unit ? " (unit-scaled)" : " (plain)") << ": " << share << " below 2^-14");
      if (unit) CHECK(share < 0.01);  // a unit normal is below 2^-14 with probability 5e-5
      worst = std::max(worst, share);
    }
    return worst;
  };
  const double unit = worst_subnormal_share(true), plain = worst_subnormal_share(false);
  INFO("worst share below 2^-14: unit-scaled " << unit << ", plain " << plain);
  CHECK(plain > 10 * unit);  // the plain model's gradients crowd fp16's subnormals
}
