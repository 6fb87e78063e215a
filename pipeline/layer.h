// A layer of a pipeline stage, as the executor drives it (docs/pipeline.md, "Executor").
// Activations are fp32, row-major [rows x features]; parameters and gradients are flat fp32
// arrays of param_count() elements. A layer holds no per-micro-batch state: everything it
// keeps between forward and backward goes into the `saved` buffer the caller provides, so
// one Layer object serves every micro-batch and may be shared between stages.
//
// Protocol. forward(x) -> y (and saved); then either backward_input(dy) -> dx followed,
// possibly much later, by backward_weight(dy) -> dparams (the Zero Bubble split: B and W),
// or backward(dy) -> dx and dparams at once; B may write into `saved` what its W reads (the
// gradients at its products' outputs). A layer that cannot split returns false from
// splits_backward(); the executor then runs its full backward during B. dparams is written,
// not accumulated: the executor sums micro-batches in micro-batch order. Every method is
// deterministic: the same inputs give the same bits, which is what makes pipelined
// gradients bitwise equal to a sequential loop and re-materialization exact. Scratch a call
// needs (a copy, a quantized operand) comes from the caller too: `work`, work_floats(rows)
// floats on the same device, whose contents are undefined on entry and dead on return, one
// buffer that every call of a stage uses in turn, so the caller counts it in its budget.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace strata::pipeline {

class Layer {
 public:
  virtual ~Layer() = default;
  virtual std::string name() const = 0;
  virtual std::size_t in_features() const = 0;
  virtual std::size_t out_features() const = 0;
  virtual std::size_t param_count() const = 0;
  // The named tensors its parameters are, in the order it reads them, each with the
  // multiplier of its learning rate (a weight computed at another scale than it is stored
  // at). Empty (the default): one unnamed tensor of param_count() at the base rate.
  struct Tensor {
    std::string name;
    std::vector<std::int64_t> shape;
    float lr_scale = 1.0f;
  };
  virtual std::vector<Tensor> tensors() const { return {}; }
  // Deterministic initial parameters from (seed, layer index).
  virtual void init_params(float* params, std::uint64_t seed, int layer_index) const = 0;
  // Floats this layer keeps from forward (and B) for backward (and W), for `rows` rows.
  virtual std::size_t saved_floats(std::size_t rows) const {
    (void)rows;
    return 0;
  }

  // Floats of scratch any one call may use (`work`), for `rows` rows.
  virtual std::size_t work_floats(std::size_t rows) const {
    (void)rows;
    return 0;
  }

  virtual void forward(const float* params, const float* x, float* y, float* saved, float* work,
                       std::size_t rows) const = 0;
  virtual bool splits_backward() const { return true; }
  // B: dx from dy. Only called when splits_backward().
  virtual void backward_input(const float* params, const float* x, float* saved, const float* dy, float* dx,
                              float* work, std::size_t rows) const = 0;
  // W: dparams from dy. Only called when splits_backward().
  virtual void backward_weight(const float* params, const float* x, const float* saved, const float* dy, float* dparams,
                               float* work, std::size_t rows) const = 0;
  // B and W together. The default runs backward_input then backward_weight.
  virtual void backward(const float* params, const float* x, float* saved, const float* dy, float* dx, float* dparams,
                        float* work, std::size_t rows) const {
    backward_input(params, x, saved, dy, dx, work, rows);
    backward_weight(params, x, saved, dy, dparams, work, rows);
  }
};

// grad[i] += add[i]: the one accumulation both the executor and the sequential reference
// use, so their sums round identically.
inline void accumulate(float* grad, const float* add, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) grad[i] += add[i];
}

}  // namespace strata::pipeline
