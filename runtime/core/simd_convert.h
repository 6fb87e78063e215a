// The fp32 <-> bf16/fp16/fp8 rounding rules (detail/small_float.h) on xsimd batches, public so
// kernels in other folders (optim's fused Adam pass) can fuse a conversion into their own
// loop and still round exactly as strata::convert does. Lanes hold the small format's code in
// the low bits of a uint32; widening the 8/16-bit storage to lanes is the caller's business.
#pragma once

#include <cstddef>
#include <cstdint>
#include <xsimd/xsimd.hpp>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "runtime/core/detail/small_float.h"
#include "runtime/core/dtype.h"

namespace strata::simd {

using BU = xsimd::batch<std::uint32_t>;
using BF = xsimd::batch<float>;
using detail::SmallFloat;

// The bit layout of a small dtype (bf16, fp16, fp8_e4m3, fp8_e5m2); fp32 is not one.
inline const SmallFloat& small_format(DType t) noexcept {
  switch (t) {
    case DType::bf16:
      return detail::kBF16;
    case DType::fp16:
      return detail::kFP16;
    case DType::fp8_e4m3:
      return detail::kE4M3;
    default:
      return detail::kE5M2;
  }
}

// fp32 bits -> small-format code, round to nearest even (same rule as encode_scalar).
inline BU encode_batch(const SmallFloat& f, const BU& u, bool saturate) noexcept {
  const BU sign = (u >> 31) << f.sign_shift();
  const BU a = u & BU(0x7fffffffu);
  const BU mb(f.magic_bits());
  const BU sub = xsimd::bitwise_cast<BU>(xsimd::bitwise_cast<BF>(a) + xsimd::bitwise_cast<BF>(mb)) - mb;
  const BU odd = (a >> f.shift()) & BU(1u);
  const BU norm = (a + BU(f.rebias_round()) + odd) >> f.shift();
  BU r = xsimd::select(a < BU(f.min_normal_bits()), sub, norm);
  r = xsimd::select(r > BU(f.max_code), BU(saturate ? f.max_code : f.inf_code), r);
  r = xsimd::select(a > BU(0x7f800000u), BU(f.nan_code), r);
  return r | sign;
}

// 16-bit codes widened to lanes and lanes narrowed to 16-bit codes with the ISA's
// zero-extend/truncate instructions (AVX-512BW, AVX2) or a small scratch array (portable builds).
inline BU load_u16(const std::uint16_t* p) noexcept {
#if XSIMD_WITH_AVX512BW
  static_assert(BU::size == 16);
  return _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#elif XSIMD_WITH_AVX2
  static_assert(BU::size == 8);
  return _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#else
  alignas(64) std::uint32_t wide[BU::size];
  for (std::size_t k = 0; k < BU::size; ++k) wide[k] = p[k];
  return BU::load_aligned(wide);
#endif
}

// kNonTemporal: bypass the caches (the data is not read again soon); p must be aligned to
// kHalfBatchBytes. Portable builds have no 8-byte streaming store and write normally.
template <bool kNonTemporal> inline void store_u16(std::uint16_t* p, const BU& codes) noexcept {
#if XSIMD_WITH_AVX512BW
  const __m256i narrow = _mm512_cvtepi32_epi16(codes);
  if constexpr (kNonTemporal)
    _mm256_stream_si256(reinterpret_cast<__m256i*>(p), narrow);
  else
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), narrow);
#elif XSIMD_WITH_AVX2
  // Codes fit in 16 bits, so unsigned saturation is a plain truncation.
  const __m256i c = codes;
  const __m128i narrow = _mm_packus_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
  if constexpr (kNonTemporal)
    _mm_stream_si128(reinterpret_cast<__m128i*>(p), narrow);
  else
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), narrow);
#else
  alignas(64) std::uint32_t wide[BU::size];
  codes.store_aligned(wide);
  for (std::size_t k = 0; k < BU::size; ++k) p[k] = static_cast<std::uint16_t>(wide[k]);
#endif
}

// encode_batch(kBF16, u, false) in five integer operations and one select, for kernels that
// write bf16 in their inner loop. bf16 keeps fp32's exponent range, so adding 0x7fff plus the
// kept LSB to the fp32 bits and keeping the upper half rounds to nearest even for normals,
// subnormals and overflow to inf alike (the carry never reaches the sign for |x| <= inf);
// only NaN needs a select, to the canonical quiet NaN with its sign. The core tests check
// it against encode_batch for all 2^32 inputs.
inline BU encode_bf16_batch(const BU& u) noexcept {
  const BU rounded = (u + BU(0x7fffu) + ((u >> 16) & BU(1u))) >> 16;
  const BU nan = ((u >> 16) & BU(0x8000u)) | BU(detail::kBF16.nan_code);
  return xsimd::select((u & BU(0x7fffffffu)) > BU(0x7f800000u), nan, rounded);
}

// Small-format code -> fp32 bits, exact (same rule as decode_scalar).
inline BU decode_batch(const SmallFloat& f, const BU& c) noexcept {
  const BU sign = ((c >> f.sign_shift()) & BU(1u)) << 31;
  const BU mag = c & BU((1u << f.sign_shift()) - 1);
  const BU e = mag >> f.man_bits;
  const BU m = mag & BU(f.man_mask());
  const BU mb(f.magic_bits());
  const BU sub = xsimd::bitwise_cast<BU>(xsimd::bitwise_cast<BF>(mb | m) - xsimd::bitwise_cast<BF>(mb));
  const BU norm = ((e + BU(static_cast<std::uint32_t>(127 - f.bias))) << 23) | (m << f.shift());
  BU r = xsimd::select(e == BU(0u), sub, norm);
  if (f.has_inf) {
    const BU quiet = xsimd::select(m != BU(0u), BU(0x00400000u), BU(0u));
    const BU special = BU(0x7f800000u) | (m << f.shift()) | quiet;
    r = xsimd::select(e == BU(f.exp_mask()), special, r);
  } else {
    r = xsimd::select(mag == BU(f.nan_code), BU(0x7fc00000u), r);
  }
  return r | sign;
}

}  // namespace strata::simd
