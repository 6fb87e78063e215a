// Reference layers for tests, demos and `strata pipeline`: a dense tanh layer on fp32 host
// buffers (with a variant that cannot split its backward), and a layer whose forward, B
// and W take fixed wall-clock times, for measuring bubbles with steady compute.
#pragma once

#include <chrono>
#include <memory>

#include "pipeline/layer.h"

namespace strata::pipeline {

// y = tanh(x W + b), W [in x out], b [out]; saves y. B: dz = dy (1 - y^2) (in `work`), dx = dz W^T.
// W: dW = x^T dz, db = sum over rows of dz. With splittable = false the layer reports that
// it cannot split and computes dz once for both (the executor runs it as a full backward).
class TanhLinear final : public Layer {
 public:
  TanhLinear(std::size_t in, std::size_t out, bool splittable = true) : in_(in), out_(out), split_(splittable) {}
  std::string name() const override;
  std::size_t in_features() const override { return in_; }
  std::size_t out_features() const override { return out_; }
  std::size_t param_count() const override { return in_ * out_ + out_; }
  void init_params(float* params, std::uint64_t seed, int layer_index) const override;
  std::size_t saved_floats(std::size_t rows) const override { return rows * out_; }
  std::size_t work_floats(std::size_t rows) const override { return rows * out_; }  // dz
  void forward(const float* params, const float* x, float* y, float* saved, float* work,
               std::size_t rows) const override;
  bool splits_backward() const override { return split_; }
  void backward_input(const float* params, const float* x, float* saved, const float* dy, float* dx, float* work,
                      std::size_t rows) const override;
  void backward_weight(const float* params, const float* x, const float* saved, const float* dy, float* dparams,
                       float* work, std::size_t rows) const override;
  void backward(const float* params, const float* x, float* saved, const float* dy, float* dx, float* dparams,
                float* work, std::size_t rows) const override;

 private:
  std::size_t in_, out_;
  bool split_;
};

// y = x * s (s: one scale per feature), then waits until the pass has taken its fixed time
// since it started (forward, B, W; a full backward takes B + W). The waiting is a sleep,
// so stages as threads do not compete for cores and the timings are steady.
class TimedLayer final : public Layer {
 public:
  using Duration = std::chrono::duration<double>;
  TimedLayer(std::size_t features, Duration forward, Duration backward_input, Duration backward_weight)
      : n_(features), f_(forward), b_(backward_input), w_(backward_weight) {}
  std::string name() const override;
  std::size_t in_features() const override { return n_; }
  std::size_t out_features() const override { return n_; }
  std::size_t param_count() const override { return n_; }
  void init_params(float* params, std::uint64_t seed, int layer_index) const override;
  void forward(const float* params, const float* x, float* y, float* saved, float* work,
               std::size_t rows) const override;
  void backward_input(const float* params, const float* x, float* saved, const float* dy, float* dx, float* work,
                      std::size_t rows) const override;
  void backward_weight(const float* params, const float* x, const float* saved, const float* dy, float* dparams,
                       float* work, std::size_t rows) const override;

 private:
  std::size_t n_;
  Duration f_, b_, w_;
};

// A deterministic value in [-1, 1) from (seed, a, b): inputs, targets and initial weights.
float hashed_uniform(std::uint64_t seed, std::uint64_t a, std::uint64_t b);

}  // namespace strata::pipeline
