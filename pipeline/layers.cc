// The reference layers (see layers.h). Loops are plain and in a fixed order: the results
// must be the same bits on every call.
#include "pipeline/layers.h"

#include <cmath>
#include <thread>

#include "runtime/core/error.h"

namespace strata::pipeline {
namespace {

// dz = dy * (1 - y^2), y being the saved output.
void tanh_grad(const float* y, const float* dy, float* dz, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dz[i] = dy[i] * (1.0f - y[i] * y[i]);
}

void input_grad(const float* w, const float* dz, float* dx, std::size_t rows, std::size_t in, std::size_t out) {
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t i = 0; i < in; ++i) {
      float acc = 0;
      for (std::size_t o = 0; o < out; ++o) acc += dz[r * out + o] * w[i * out + o];
      dx[r * in + i] = acc;
    }
  }
}

void weight_grad(const float* x, const float* dz, float* dp, std::size_t rows, std::size_t in, std::size_t out) {
  float* dw = dp;
  float* db = dp + in * out;
  for (std::size_t i = 0; i < in * out + out; ++i) dp[i] = 0;
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t i = 0; i < in; ++i) {
      const float xv = x[r * in + i];
      for (std::size_t o = 0; o < out; ++o) dw[i * out + o] += xv * dz[r * out + o];
    }
    for (std::size_t o = 0; o < out; ++o) db[o] += dz[r * out + o];
  }
}

void sleep_rest(std::chrono::steady_clock::time_point start, TimedLayer::Duration d) {
  std::this_thread::sleep_until(start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(d));
}

}  // namespace

float hashed_uniform(std::uint64_t seed, std::uint64_t a, std::uint64_t b) {
  // splitmix64 over the three words.
  std::uint64_t z = seed * 0x9E3779B97F4A7C15ull ^ (a + 0x632BE59BD9B4E019ull) * 0xBF58476D1CE4E5B9ull ^
                    (b + 0x8CB92BA72F3D8DD7ull) * 0x94D049BB133111EBull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(static_cast<double>(z >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

std::string TanhLinear::name() const {
  return str_cat("tanh_linear(", in_, "x", out_, split_ ? "" : ", no B/W split", ")");
}

void TanhLinear::init_params(float* params, std::uint64_t seed, int layer_index) const {
  const float scale = 1.0f / std::sqrt(static_cast<float>(in_));
  for (std::size_t i = 0; i < param_count(); ++i)
    params[i] = scale * hashed_uniform(seed, static_cast<std::uint64_t>(layer_index), i);
}

void TanhLinear::forward(const float* params, const float* x, float* y, float* saved, float*, std::size_t rows) const {
  const float* w = params;
  const float* b = params + in_ * out_;
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t o = 0; o < out_; ++o) {
      float acc = b[o];
      for (std::size_t i = 0; i < in_; ++i) acc += x[r * in_ + i] * w[i * out_ + o];
      y[r * out_ + o] = std::tanh(acc);
    }
  }
  for (std::size_t i = 0; i < rows * out_; ++i) saved[i] = y[i];
}

void TanhLinear::backward_input(const float* params, const float*, float* saved, const float* dy, float* dx,
                                float* work, std::size_t rows) const {
  tanh_grad(saved, dy, work, rows * out_);
  input_grad(params, work, dx, rows, in_, out_);
}

void TanhLinear::backward_weight(const float*, const float* x, const float* saved, const float* dy, float* dparams,
                                 float* work, std::size_t rows) const {
  tanh_grad(saved, dy, work, rows * out_);
  weight_grad(x, work, dparams, rows, in_, out_);
}

void TanhLinear::backward(const float* params, const float* x, float* saved, const float* dy, float* dx, float* dparams,
                          float* work, std::size_t rows) const {
  tanh_grad(saved, dy, work, rows * out_);
  input_grad(params, work, dx, rows, in_, out_);
  weight_grad(x, work, dparams, rows, in_, out_);
}

std::string TimedLayer::name() const {
  return str_cat("timed(", n_, ", F=", f_.count() * 1e3, "ms B=", b_.count() * 1e3, "ms W=", w_.count() * 1e3, "ms)");
}

void TimedLayer::init_params(float* params, std::uint64_t seed, int layer_index) const {
  for (std::size_t i = 0; i < n_; ++i)
    params[i] = 1.0f + 0.25f * hashed_uniform(seed, static_cast<std::uint64_t>(layer_index), i);
}

void TimedLayer::forward(const float* params, const float* x, float* y, float*, float*, std::size_t rows) const {
  const auto start = std::chrono::steady_clock::now();
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t i = 0; i < n_; ++i) y[r * n_ + i] = x[r * n_ + i] * params[i];
  sleep_rest(start, f_);
}

void TimedLayer::backward_input(const float* params, const float*, float*, const float* dy, float* dx, float*,
                                std::size_t rows) const {
  const auto start = std::chrono::steady_clock::now();
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t i = 0; i < n_; ++i) dx[r * n_ + i] = dy[r * n_ + i] * params[i];
  sleep_rest(start, b_);
}

void TimedLayer::backward_weight(const float*, const float* x, const float*, const float* dy, float* dparams, float*,
                                 std::size_t rows) const {
  const auto start = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < n_; ++i) dparams[i] = 0;
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t i = 0; i < n_; ++i) dparams[i] += x[r * n_ + i] * dy[r * n_ + i];
  sleep_rest(start, w_);
}

}  // namespace strata::pipeline
