// A LayerAccess over plain arrays (no engine): the GPT's parameters as per-layer NamedTensors
// in registration order, and fp32 gradient accumulators beside them; ArrayAccess holds them
// in host memory, DeviceArrayAccess copies them to a device (a CUDA pass's). The PyTorch
// oracle's dump, `strata bench gpt` and the GPU tests run the pass through them, so what they
// measure is the model's compute alone.
#pragma once

#include <cstdint>
#include <vector>

#include "models/gpt/config.h"
#include "models/gpt/pass.h"
#include "models/safetensors.h"
#include "runtime/device/device.h"

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

// The same on `dev`: every tensor and its accumulator in one allocation there (inside the
// budget: bytes()), copied up once; accumulators are zeroed through `kernels` (the pass's,
// on their stream) at the first grads() since the layer's last commit.
class DeviceArrayAccess : public LayerAccess {
 public:
  DeviceArrayAccess(device::Device& dev, GptKernels& kernels, const std::vector<std::vector<NamedTensor>>& params);
  static std::uint64_t bytes(const GptShape& s) noexcept;

  std::vector<const float*> acquire(int layer) override;
  void release(int) override {}
  std::vector<float*> grads(int layer) override;
  void commit(int layer) override;
  // Every accumulator, in registration order, copied back (waits for the kernels).
  std::vector<std::vector<float>> all_grads();

 private:
  GptKernels& k_;
  device::DeviceBuffer mem_;
  std::vector<std::vector<float*>> p_, g_;
  std::vector<std::vector<std::size_t>> n_;  // elements of each tensor
  std::vector<bool> open_;
};

}  // namespace strata::model
