// A LayerAccess over plain host arrays (no engine): the GPT's parameters as per-layer
// NamedTensors in registration order, and fp32 gradient accumulators beside them. The
// PyTorch oracle's dump and `strata bench gpt` run the pass through it, so what they
// measure is the model's compute alone.
#pragma once

#include <cstdint>
#include <vector>

#include "models/gpt/config.h"
#include "models/gpt/pass.h"
#include "models/safetensors.h"

namespace strata::model {

// Every parameter's initial values exactly as the engine makes them for `seed`
// (engine::init_values keyed by name), in registration order; unit_scaled: the unit-scaled
// model's (config.h).
std::vector<NamedTensor> gpt_initial_params(const GptShape& s, std::uint64_t seed, bool unit_scaled = false);

class ArrayAccess : public LayerAccess {
 public:
  // params[layer] holds that layer's tensors in registration order; must outlive this.
  explicit ArrayAccess(std::vector<std::vector<NamedTensor>>& params);
  // Groups a registration-order list (gpt_initial_params) by engine layer.
  static std::vector<std::vector<NamedTensor>> by_layer(const GptShape& s, std::vector<NamedTensor> all);

  std::vector<const float*> acquire(int layer) override;
  void release(int) override {}
  // Zeroed at the first call since the layer's last commit.
  std::vector<float*> grads(int layer) override;
  void commit(int layer) override;
  // Every gradient accumulated so far, in registration order.
  std::vector<NamedTensor> all_grads() const;

 private:
  std::vector<std::vector<NamedTensor>>& p_;
  std::vector<std::vector<NamedTensor>> g_;
  std::vector<bool> open_;
};

}  // namespace strata::model
