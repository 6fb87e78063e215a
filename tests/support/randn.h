// Test inputs: n standard-normal floats (times scale) from a key, the same on every machine
// (splitmix64 and Box-Muller, runtime/core/random.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "runtime/core/random.h"

namespace strata::test {

inline std::vector<float> randn(std::size_t n, std::uint64_t key, float scale = 1.0f) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = static_cast<float>(box_muller(splitmix64(key + 2 * i), splitmix64(key + 2 * i + 1))) * scale;
  return v;
}

}  // namespace strata::test
