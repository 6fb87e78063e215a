// The demo model: an MLP stack (tanh hidden layers, linear output) regressing a fixed
// random "teacher" function, trained through the ZeRO engine's host-trainer contract on the
// host device. Each layer l has "layers.l.weight" [H, H] and "layers.l.bias" [H]. Data is
// generated from the seed and the global sample index, so a step sees the same samples at
// any world size: rank r's micro-batch k of step s holds samples
// s*train_batch + (k*world + r)*micro + [0, micro). `layer_ms` makes each layer's forward
// take that long (backward twice that), to model compute when measuring overlap.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/core/trace.h"
#include "engine/zero/engine.h"

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
  double loss = 0.0;         // mean over the whole step's samples (all ranks), before the update
  zero::StepResult result;
};

class Mlp {
 public:
  // Registers the parameters; call engine.setup() afterwards.
  Mlp(zero::Engine& engine, const MlpConfig& config, comm::Communicator* comm = nullptr, Tracer* tracer = nullptr);
  MlpStep train_step(std::int64_t step);
  std::size_t parameter_count() const noexcept;

 private:
  void make_batch(std::int64_t step, int micro_batch, std::vector<float>& x, std::vector<float>& target) const;

  zero::Engine& engine_;
  MlpConfig cfg_;
  comm::Communicator* comm_;
  Tracer* tracer_;
  std::vector<float> teacher_;  // [H, H], fixed
};

}  // namespace strata::model
