// The engine suites' host trainer: a stack of dense tanh layers written against the
// host-trainer contract alone (what DeepSpeed's unit tests call a simple model), so that the
// suites that test the engine link no model. Layer l is pipeline::TanhLinear (y = tanh(x W +
// b), W [H, H] and b [H], registered as "layers.l.weight" and "layers.l.bias" with the
// engine's initial values). Sample s's input is H uniform values in (0, 1) keyed by (seed, s),
// its target mostly a fixed vector plus a little of the input: inputs of one sign move the
// outputs coherently, so ten steps of Adam at the tests' learning rate lower the loss well
// above the noise of fresh batches. Rank r of `world`'s micro-batch k of step `step` holds
// samples step * train_batch + (k * world + r) * micro + [0, micro), so a step sees the same
// samples at any world size. The loss of a micro-batch is 0.5 *
// sum over samples and outputs of (y - t)^2 / H; the gradient handed to the engine is that of
// the mean over the micro-batch, times the loss scale. Arithmetic is fp32 on the host in one
// fixed order whatever the device. On the host device the trainer reads and writes the
// engine's views where they are (inside a CpuAccessScope, as a trainer computing on the device
// does: nothing crosses the modelled link, and a guarded device's memory is reached only
// there); on a CUDA device gathered parameters come to the host and gradients go back through
// a stream of its own. `layer_ms` makes each layer's forward take that long and its backward
// twice that, inside a "compute" span: modelled compute for overlap tests.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/engine.h"
#include "pipeline/layers.h"
#include "runtime/core/trace.h"

namespace strata::comm {
class Communicator;
}

namespace strata::test {

struct StackConfig {
  int layers = 3;
  int hidden = 32;
  double layer_ms = 0.0;
  std::uint64_t seed = 7;
  std::vector<int> frozen;  // layers frozen (Engine::freeze_layer): no gradient handed back
};

struct StackStep {
  double loss = 0.0;  // mean over the whole step's samples (all ranks), before the update
  engine::StepResult result;
};

class StackTrainer {
 public:
  // Registers the parameters (and freezes `frozen`); call engine.setup() afterwards.
  StackTrainer(engine::Engine& engine, const StackConfig& config, comm::Communicator* comm = nullptr,
               Tracer* tracer = nullptr);
  StackStep train_step(std::int64_t step);

 private:
  void batch(std::int64_t step, int k, std::vector<float>& x, std::vector<float>& target) const;
  double micro_batch(int k, const std::vector<float>& x, const std::vector<float>& target);
  void to_host(const std::vector<engine::TensorView>& views, std::vector<float>& out);
  void to_device(const std::vector<float>& values, const std::vector<engine::TensorView>& views);
  bool frozen(int layer) const;

  engine::Engine& engine_;
  StackConfig cfg_;
  comm::Communicator* comm_;
  Tracer* tracer_;
  pipeline::TanhLinear layer_;
  std::unique_ptr<device::Stream> stream_;  // CUDA: copies between the engine's views and the host
  std::vector<char> narrow_;                // compute-dtype bytes on their way
};

}  // namespace strata::test
