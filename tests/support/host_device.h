// A host-emulated device with small budgets, for tests that need its streams and signals, not
// its memory.
#pragma once

#include <cstdint>
#include <memory>

#include "runtime/device/device.h"

namespace strata::test {

inline std::unique_ptr<device::Device> small_host_device(std::uint64_t bytes = 16u << 20) {
  device::DeviceOptions o;
  o.budget_bytes = bytes;
  o.pinned_budget_bytes = bytes;
  return device::Device::create(o);
}

}  // namespace strata::test
