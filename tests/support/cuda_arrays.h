// For the models' [cuda] kernel tests: a CUDA device with a 4 GiB budget, and device copies of
// host arrays. up() copies in and waits; down() reads back through the GPT kernels' stream
// (to_host waits), so it follows the kernels' own order.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "models/gpt/kernels.h"
#include "runtime/device/device.h"

namespace strata::test {

inline std::unique_ptr<device::Device> cuda_device() {
  device::DeviceOptions o;
  o.backend = device::Backend::cuda;
  o.budget_bytes = std::uint64_t{4} << 30;
  return device::Device::create(o);
}

struct CudaArrays {
  std::unique_ptr<device::Device> dev = cuda_device();
  std::unique_ptr<device::Stream> stream = dev->create_stream();
  std::vector<device::DeviceBuffer> keep;
  float* up(const std::vector<float>& h) {
    keep.emplace_back(*dev, std::max<std::size_t>(h.size(), 1) * 4, "cuda kernel test");
    stream->copy_async(keep.back().get(), h.data(), h.size() * 4, device::CopyKind::host_to_device);
    stream->synchronize();
    return keep.back().as<float>();
  }
  std::vector<float> down(model::GptKernels& k, const float* d, std::size_t n) {
    std::vector<float> h(n);
    k.to_host(h.data(), d, n);
    return h;
  }
};

}  // namespace strata::test
