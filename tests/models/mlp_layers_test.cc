// The demo MLP's layers and data (models/mlp_layers.h): a layer's forward, B and W against a
// double-precision reference of the same maths; a sample is the same at any world size; the
// loss gradient is that of the mean. (That the pipelined MLP has the plain trainer's bits is
// tests/tools/train_pipeline_mlp_test.sh's.)
#include "models/mlp_layers.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

namespace strata::model {
namespace {

std::vector<float> ramp(std::size_t n, float scale, float shift) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = scale * std::sin(0.37f * static_cast<float>(i) + shift);
  return v;
}

void check_close(const std::vector<float>& got, const std::vector<double>& want, double tol) {
  REQUIRE(got.size() == want.size());
  double worst = 0, norm = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    worst = std::max(worst, std::abs(got[i] - want[i]));
    norm = std::max(norm, std::abs(want[i]));
  }
  INFO("largest difference " << worst << " against a largest value " << norm);
  CHECK(worst <= tol * norm);
}

}  // namespace

TEST_CASE("an MLP layer's forward, B and W match a double-precision reference", "[mlp]") {
  const MlpConfig c{3, 12, 0.0, 7};
  const std::size_t H = 12, rows = 5;
  for (int index : {0, 2}) {  // a tanh layer and the linear last one
    const MlpLayer layer(c, index);
    std::vector<float> p(layer.param_count());
    layer.init_params(p.data(), 7, index);
    for (std::size_t o = 0; o < H; ++o) p[H * H + o] = 0.01f * static_cast<float>(o);  // a nonzero bias
    const auto x = ramp(rows * H, 1.0f, 0.1f), dy = ramp(rows * H, 0.5f, 1.3f);
    std::vector<float> y(rows * H), saved(layer.saved_floats(rows)), dx(rows * H), dp(layer.param_count());
    REQUIRE(layer.work_floats(rows) == 0);
    layer.forward(p.data(), x.data(), y.data(), saved.data(), nullptr, rows);
    layer.backward_input(p.data(), x.data(), saved.data(), dy.data(), dx.data(), nullptr, rows);
    layer.backward_weight(p.data(), x.data(), saved.data(), dy.data(), dp.data(), nullptr, rows);

    std::vector<double> ry(rows * H), rdz(rows * H), rdx(rows * H, 0.0), rdp(layer.param_count(), 0.0);
    for (std::size_t s = 0; s < rows; ++s)
      for (std::size_t o = 0; o < H; ++o) {
        double z = p[H * H + o];
        for (std::size_t i = 0; i < H; ++i) z += static_cast<double>(p[o * H + i]) * x[s * H + i];
        ry[s * H + o] = index == 2 ? z : std::tanh(z);
        rdz[s * H + o] = index == 2 ? dy[s * H + o] : dy[s * H + o] * (1 - std::tanh(z) * std::tanh(z));
      }
    for (std::size_t s = 0; s < rows; ++s)
      for (std::size_t o = 0; o < H; ++o) {
        rdp[H * H + o] += rdz[s * H + o];
        for (std::size_t i = 0; i < H; ++i) {
          rdx[s * H + i] += static_cast<double>(p[o * H + i]) * rdz[s * H + o];
          rdp[o * H + i] += rdz[s * H + o] * x[s * H + i];
        }
      }
    check_close(y, ry, 1e-5);
    check_close(dx, rdx, 1e-5);
    check_close(dp, rdp, 1e-5);
  }
}

TEST_CASE("an MLP sample is the same at any world size", "[mlp]") {
  const MlpData data(8, 3);
  const int micro = 2, accum = 2;
  // World 1: one rank's micro-batches 0..3 hold samples 0..7 of step 1 (train batch 8).
  std::vector<float> x1(8 * 8), t1(8 * 8);
  for (int k = 0; k < 2 * accum; ++k)
    data.batch(1, 8, k, 0, 1, micro, x1.data() + k * micro * 8, t1.data() + k * micro * 8);
  // World 2: rank r's micro-batch k holds samples (k * 2 + r) * micro + [0, micro).
  for (int r = 0; r < 2; ++r)
    for (int k = 0; k < accum; ++k) {
      std::vector<float> x(micro * 8), t(micro * 8);
      data.batch(1, 8, k, r, 2, micro, x.data(), t.data());
      const std::size_t at = static_cast<std::size_t>((k * 2 + r) * micro * 8);
      CHECK(std::vector<float>(x1.begin() + at, x1.begin() + at + x.size()) == x);
      CHECK(std::vector<float>(t1.begin() + at, t1.begin() + at + t.size()) == t);
    }
  // The loss gradient is that of the micro-batch's mean loss, times the scale.
  std::vector<float> y(micro * 8, 0.25f), grad(micro * 8);
  const double loss = data.loss_and_grad(y.data(), t1.data(), grad.data(), micro, 4.0f);
  double want = 0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    const double d = 0.25 - t1[i];
    want += 0.5 * d * d / 8;
    CHECK(std::abs(grad[i] - 4.0 * d / (8 * micro)) <= 1e-6);
  }
  CHECK(std::abs(loss - want) <= 1e-6 * want);
}

}  // namespace strata::model
