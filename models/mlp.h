// The demo model: an MLP stack (tanh hidden layers, linear output) regressing a fixed
// random "teacher" function, trained through the ZeRO engine's host-trainer contract. Its
// forward and backward run where the engine's device is: on the host device in fp32 loops,
// on a CUDA device with cuBLAS SGEMMs and small kernels (detail/mlp_cuda.cu) on its own
// stream; activations live on that device (outside the engine's ledger, inside the
// device's budget). Both compute in fp32 from the compute-dtype parameters; they differ
// only in the order of the sums. Each layer l has "layers.l.weight" [H, H] and "layers.l.bias" [H]. Data is
// generated from the seed and the global sample index, so a step sees the same samples at
// any world size: rank r's micro-batch k of step s holds samples
// s*train_batch + (k*world + r)*micro + [0, micro). `layer_ms` makes each layer's forward
// take that long (backward twice that), to model compute when measuring overlap.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/engine.h"
#include "runtime/core/trace.h"

namespace strata::comm {
class Communicator;
}

namespace strata::model {

struct MlpConfig {
  int layers = 4;
  int hidden = 64;
  double layer_ms = 0.0;
  std::uint64_t seed = 0;
};

struct MlpStep {
  double loss = 0.0;  // mean over the whole step's samples (all ranks), before the update
  engine::StepResult result;
};

class Mlp {
 public:
  // Registers the parameters; call engine.setup() afterwards.
  Mlp(engine::Engine& engine, const MlpConfig& config, comm::Communicator* comm = nullptr, Tracer* tracer = nullptr);
  ~Mlp();
  MlpStep train_step(std::int64_t step);
  // The parameters the constructor registers, in order (for estimates without an engine).
  static std::vector<engine::ParamSpec> param_specs(const MlpConfig& config);
  std::size_t parameter_count() const noexcept;

 private:
  void make_batch(std::int64_t step, int micro_batch, std::vector<float>& x, std::vector<float>& target) const;
  // One micro-batch's forward and backward through the engine; returns its summed loss.
  double host_micro_batch(int k, const std::vector<float>& x, const std::vector<float>& target);
  double cuda_micro_batch(int k, const std::vector<float>& x, const std::vector<float>& target);
  // 0.5 * sum over samples and outputs of (y - t)^2 / H; grad = dL/dy of the micro-batch
  // mean, times the loss scale.
  double loss_and_grad(const float* y, const float* target, float* grad) const;

  engine::Engine& engine_;
  MlpConfig cfg_;
  comm::Communicator* comm_;
  Tracer* tracer_;
  const std::vector<float>& teacher() const;  // made on first use
  mutable std::vector<float> teacher_;        // [H, H], fixed
  struct Gpu;
  std::unique_ptr<Gpu> gpu_;  // the CUDA path's stream, cuBLAS handle and buffers
};

}  // namespace strata::model
