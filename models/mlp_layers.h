// The demo MLP's model code, shared by its trainer (mlp.h) and the pipeline executor
// (pipeline/layer.h): the data, the loss and one layer's host forward and backward.
//
// Data: a fixed random "teacher" matrix T [H, H]; sample s's input is H gaussians keyed by
// (seed, s) and its target sin(T x). Rank r of `world`'s micro-batch k of step `step` holds
// samples step * train_batch + (k * world + r) * micro + [0, micro), so a step sees the same
// samples at any world size. The loss of a micro-batch is 0.5 * sum over samples and outputs
// of (y - t)^2 / H; its gradient is that of the micro-batch mean.
//
// MlpLayer l: y = tanh(W x + b), the last layer linear (y = W x + b), W [H, H] and b [H]
// (the trainer's tensors "layers.l.weight" and "layers.l.bias", concatenated in that order as
// the layer's parameters, with the engine's initial values for them). Arithmetic is fp32
// host loops in one fixed order; the backward splits into B (dx) and W (dW, db), each the
// bits of the fused backward, which is what lets a pipelined MLP match the trainer bitwise.
// `layer_ms` makes F, B and W each take that long (a modelled compute time).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/layout.h"
#include "pipeline/model.h"

namespace strata::model {

struct MlpConfig {
  int layers = 4;
  int hidden = 64;
  double layer_ms = 0.0;
  std::uint64_t seed = 0;
  // Layers that take no gradient (Engine::freeze_layer): backward carries the gradient
  // through them to the layers below and hands the engine none of theirs.
  std::vector<int> frozen;
};

// The trainer's tensors, in registration order (layer l: weight, bias; engine layer id l).
std::vector<engine::ParamSpec> mlp_param_specs(const MlpConfig& config);

class MlpData {
 public:
  // Makes the teacher; throws Errc::out_of_budget naming --hidden when host RAM cannot hold it.
  MlpData(int hidden, std::uint64_t seed);
  // `micro` samples of rank `rank`'s micro-batch k of step `step`: x and target [micro, H].
  // `target` null: the inputs alone.
  void batch(std::int64_t step, std::int64_t train_batch, int k, int rank, int world, int micro, float* x,
             float* target) const;
  // The micro-batch's summed loss; grad = dL/dy of its mean times `scale` (the loss scale).
  double loss_and_grad(const float* y, const float* target, float* grad, std::size_t rows, float scale) const;

 private:
  std::size_t H_;
  std::uint64_t seed_;
  std::vector<float> teacher_;  // [H, H]
};

class MlpLayer final : public pipeline::Layer {
 public:
  MlpLayer(const MlpConfig& config, int index);
  std::string name() const override;
  std::size_t in_features() const override { return H_; }
  std::size_t out_features() const override { return H_; }
  std::size_t param_count() const override { return H_ * H_ + H_; }
  void init_params(float* params, std::uint64_t seed, int layer_index) const override;
  // The output (tanh layers): B turns it into the gradient at W x + b, which W reads.
  std::size_t saved_floats(std::size_t rows) const override { return last_ ? 0 : rows * H_; }
  void forward(const float* params, const float* x, float* y, float* saved, float* work,
               std::size_t rows) const override;
  void backward_input(const float* params, const float* x, float* saved, const float* dy, float* dx, float* work,
                      std::size_t rows) const override;
  void backward_weight(const float* params, const float* x, const float* saved, const float* dy, float* dparams,
                       float* work, std::size_t rows) const override;

 private:
  const std::size_t H_;
  const int index_;
  const bool last_;
  const double ms_;
  const std::vector<engine::ParamSpec> specs_;  // weight, bias
};

struct MlpPipeline {
  pipeline::PipelineModel model;
  // Each micro-batch's summed loss, as the last stage saw it (read after the step).
  std::shared_ptr<std::vector<double>> losses;
};

// The MLP as pipeline layers for micro-batches of `micro_batch` samples, `micro_batches` of
// them per step, with the data of data-parallel rank `rank` of `world`: the layers, inputs
// and loss gradients the trainer gives the engine with the same config. `data` (made from
// the config when null) may be shared by the models of one process.
MlpPipeline mlp_pipeline_model(const MlpConfig& config, int micro_batch, int micro_batches, int rank = 0, int world = 1,
                               std::shared_ptr<const MlpData> data = nullptr);

}  // namespace strata::model
