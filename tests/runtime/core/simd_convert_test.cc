// The batch conversion rules of simd_convert.h that other folders' kernels call directly:
// the bf16 fast encoder must agree with the general rule on every input.
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <atomic>
#include <cstdint>

#include <catch2/catch.hpp>

#include "runtime/core/simd_convert.h"

using namespace strata;

TEST_CASE("the bf16 fast encoder agrees with the general rule on all 2^32 inputs", "[dtype]") {
  using simd::BU;
  constexpr std::uint32_t kLanes = BU::size;
  std::atomic<std::uint64_t> mismatches{0};  // groups of 65536 inputs with a mismatch
  alignas(64) std::uint32_t iota_bits[kLanes];
  for (std::uint32_t k = 0; k < kLanes; ++k) iota_bits[k] = k;
  const BU iota = BU::load_aligned(iota_bits);
  tbb::parallel_for(tbb::blocked_range<std::uint32_t>(0, 1u << 16), [&](const auto& r) {
    std::uint64_t bad = 0;
    for (std::uint32_t hi = r.begin(); hi != r.end(); ++hi) {
      BU diff(0u);
      for (std::uint32_t lo = 0; lo < (1u << 16); lo += kLanes) {
        const BU u = BU((hi << 16) | lo) + iota;
        diff = diff | (simd::encode_bf16_batch(u) ^ simd::encode_batch(detail::kBF16, u, false));
      }
      bad += xsimd::any(diff != BU(0u)) ? 1 : 0;  // 65536 inputs sharing the upper half
    }
    mismatches += bad;
  });
  CHECK(mismatches == 0);
}
