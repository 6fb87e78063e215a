// Bitwise equality of two fp32 vectors: the tests' check that stages, placements, pipelines
// and resumes give the same bits, not merely close values (a -0.0 against 0.0, or two NaNs
// with different payloads, count as different).
#pragma once

#include <cstring>
#include <vector>

namespace strata::test {

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace strata::test
