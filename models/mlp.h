// The demo model: an MLP stack (tanh hidden layers, linear output) regressing a fixed
// random "teacher" function, trained through the ZeRO engine's host-trainer contract. Its
// data, loss and host layers are mlp_layers.h's, the code the pipeline executor runs too.
// Forward and backward run where the engine's device is: on the host device through
// MlpLayer (fp32 loops), on a CUDA device with cuBLAS SGEMMs and small kernels
// (detail/mlp_cuda.cu) on its own stream; activations live on that device (outside the
// engine's ledger, inside the device's budget). Both compute in fp32 from the
// compute-dtype parameters; they differ only in the order of the sums. `layer_ms` makes
// each layer's forward take that long (backward twice that), to model compute when
// measuring overlap.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/engine.h"
#include "models/mlp_layers.h"
#include "runtime/core/trace.h"

namespace strata::comm {
class Communicator;
}

namespace strata::model {

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
  std::size_t parameter_count() const noexcept;

 private:
  void make_batch(std::int64_t step, int micro_batch, std::vector<float>& x, std::vector<float>& target) const;
  // One micro-batch's forward and backward through the engine; returns its summed loss.
  double host_micro_batch(int k, const std::vector<float>& x, const std::vector<float>& target);
  double cuda_micro_batch(int k, const std::vector<float>& x, const std::vector<float>& target);
  double loss_and_grad(const float* y, const float* target, float* grad) const;  // with the loss scale
  bool frozen(int layer) const;

  engine::Engine& engine_;
  MlpConfig cfg_;
  comm::Communicator* comm_;
  Tracer* tracer_;
  std::vector<MlpLayer> layers_;
  // Made at the first batch, after engine.setup() has checked the model's state against the
  // machine's memory.
  mutable std::unique_ptr<const MlpData> data_;
  struct Gpu;
  std::unique_ptr<Gpu> gpu_;  // the CUDA path's stream, cuBLAS handle and buffers
};

}  // namespace strata::model
