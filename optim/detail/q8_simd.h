// The q8 block codec (runtime/core/q8_codec.h) in xsimd lanes for the CPU optimizers: the same
// operations element for element, without the scalar form's branches (which a block of
// values of mixed size mispredicts). The scalar form stays the definition and what the CUDA
// kernel runs; the tests hold the two to the same bytes.
#pragma once

#include <xsimd/xsimd.hpp>

#include <algorithm>
#include <cstdint>

#include "optim/detail/simd_io.h"
#include "runtime/core/q8_codec.h"

namespace strata::optim::detail::q8simd {

using IB = xsimd::batch<std::int32_t>;
inline constexpr int kBatches = q8::kBlockElems / static_cast<int>(kLanes);

inline FB as_float(const UB& u) noexcept { return xsimd::bitwise_cast<FB>(u); }
inline UB as_bits(const FB& f) noexcept { return xsimd::bitwise_cast<UB>(f); }
inline UB as_u(const IB& i) noexcept { return xsimd::bitwise_cast<UB>(i); }
inline IB as_i(const UB& u) noexcept { return xsimd::bitwise_cast<IB>(u); }

// The 16 codes of a block widened to 32-bit lanes (c[0..15]), and narrowed back to bytes.
inline void load_codes(const std::uint8_t* in, std::uint32_t* c) noexcept {
#if XSIMD_WITH_AVX512F
  _mm512_store_si512(c, _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in))));
#elif XSIMD_WITH_AVX2
  for (int h = 0; h < 2; ++h)
    _mm256_store_si256(reinterpret_cast<__m256i*>(c + 8 * h),
                       _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(in + 8 * h))));
#else
  for (int i = 0; i < q8::kBlockElems; ++i) c[i] = in[i];
#endif
}
inline void store_codes(const std::uint32_t* c, std::uint8_t* out) noexcept {  // every c[i] <= 255
#if XSIMD_WITH_AVX512F
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm512_cvtepi32_epi8(_mm512_load_si512(c)));
#elif XSIMD_WITH_AVX2
  const __m256i lo = _mm256_load_si256(reinterpret_cast<const __m256i*>(c));
  const __m256i hi = _mm256_load_si256(reinterpret_cast<const __m256i*>(c + 8));
  const __m256i words = _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xD8);  // 16 u16 in order
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out),
                   _mm_packus_epi16(_mm256_castsi256_si128(words), _mm256_extracti128_si256(words, 1)));
#else
  for (int i = 0; i < q8::kBlockElems; ++i) out[i] = static_cast<std::uint8_t>(c[i]);
#endif
}
// The largest lane of a batch of non-negative floats.
inline float max_lane(const FB& x) noexcept {
#if XSIMD_WITH_AVX512F
  return _mm512_reduce_max_ps(x);
#elif XSIMD_WITH_AVX2
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
#else
  alignas(64) float lanes[kLanes];
  x.store_aligned(lanes);
  float amax = 0.0f;
  for (float l : lanes) amax = l > amax ? l : amax;
  return amax;
#endif
}

// Magnitudes of codes c (sign bit cleared) with `man` mantissa bits: magnitude_of().
template <int kMan> inline FB magnitude(const UB& c) noexcept {
  const UB e = c >> kMan, f = c & UB((1u << kMan) - 1);
  const FB normal = as_float(((e + UB(120)) << 23) | (f << (23 - kMan)));
  const FB sub = xsimd::to_float(as_i(f)) * FB(q8::pow2(-6 - kMan));
  return as_float(xsimd::select(e == UB(0), as_bits(sub), as_bits(normal)));
}

// decode_block(): 16 codes (and the scale byte) to 16 floats at x.
template <bool kSecond> inline void decode(const std::uint8_t* in, float* x) noexcept {
  const std::uint8_t s = in[0];
  if (s == 0) {
    for (int i = 0; i < q8::kBlockElems; ++i) x[i] = 0.0f;
    return;
  }
  const FB scale(q8::pow2(static_cast<int>(s) - 127));
  alignas(64) std::uint32_t c[q8::kBlockElems];
  load_codes(in + 1, c);
  for (int b = 0; b < kBatches; ++b) {
    const UB code = UB::load_aligned(c + b * kLanes);
    FB y;
    if constexpr (kSecond) {
      const FB w = magnitude<4>(code) * scale;
      y = w * w;
    } else {
      y = as_float(as_bits(magnitude<3>(code & UB(0x7f)) * scale) | ((code & UB(0x80)) << 24));
    }
    y.store_unaligned(x + b * kLanes);
  }
}

// encode_block() with salt: 16 floats at x to a block at out.
template <bool kSecond> inline void encode(const float* x, std::uint8_t* out, std::uint32_t salt) noexcept {
  constexpr int kMan = kSecond ? 4 : 3;
  FB mag[kBatches];
  FB top(0.0f);
  for (int b = 0; b < kBatches; ++b) {
    const FB v = FB::load_unaligned(x + b * kLanes);
    mag[b] = kSecond ? xsimd::sqrt(v) : as_float(as_bits(v) & UB(0x7fffffffu));
    top = xsimd::max(top, mag[b]);
  }
  const std::uint8_t s = q8::scale_for(max_lane(top), kSecond);
  out[0] = s;
  if (s == 0) {
    for (int i = 0; i < q8::kBlockElems; ++i) out[1 + i] = 0;
    return;
  }
  const FB inv(q8::pow2(127 - static_cast<int>(s)));
  const UB key = UB(salt * 0x9E3779B9u) ^ UB(kSecond ? 0x5BD1E995u : 0u);
  alignas(64) static constexpr std::uint32_t kLaneKey[q8::kBlockElems] = {
      // lane x 0x85EBCA6B
      0x00000000u, 0x85EBCA6Bu, 0x0BD794D6u, 0x91C35F41u, 0x17AF29ACu, 0x9D9AF417u, 0x2386BE82u, 0xA97288EDu,
      0x2F5E5358u, 0xB54A1DC3u, 0x3B35E82Eu, 0xC121B299u, 0x470D7D04u, 0xCCF9476Fu, 0x52E511DAu, 0xD8D0DC45u};
  alignas(64) std::uint32_t code[q8::kBlockElems];
  for (int b = 0; b < kBatches; ++b) {
    const FB t = mag[b] * inv;  // exact; at most 240 (248): rounds to at most that
    // dither(): mix of the bits, the salt, the lane and the moment
    UB h = as_bits(t) ^ key ^ UB::load_aligned(kLaneKey + b * kLanes);
    h ^= h >> 16;
    h *= UB(0x7feb352du);
    h ^= h >> 15;
    h *= UB(0x846ca68bu);
    h ^= h >> 16;
    const FB u = xsimd::to_float(as_i(h >> 13)) * FB(1.0f / 524288.0f);
    // round_steps()
    const IB e = as_i((as_bits(t) >> 23) & UB(0xffu)) - IB(127);
    IB k = xsimd::max(e, IB(-6));
    const FB p = as_float(as_u(IB(kMan + 127) - k) << 23);
    IB r;
    if constexpr (kSecond) {  // the step up with the square's probability
      const FB a = t * p;
      const IB r0 = xsimd::to_int(a);
      const FB r0f = xsimd::to_float(r0);
      const FB num = (a - r0f) * (a + r0f), den = r0f + r0f + FB(1.0f);
      r = r0 + xsimd::to_int(xsimd::select(u * den < num, FB(1.0f), FB(0.0f)));
      r = xsimd::select((r == IB(0)) & (as_i(as_bits(t)) > IB(0)), IB(1), r);  // never zero (t > 0)
    } else {
      r = xsimd::to_int(t * p + u);  // truncation of a non-negative value: floor
    }
    // code_of()
    const auto sub = (k == IB(-6)) & (r < IB(1 << kMan));
    const auto big = r >= IB(2 << kMan);
    const IB rn = xsimd::select(big, r >> 1, r), kn = xsimd::select(big, k + IB(1), k);
    IB c = xsimd::select(sub, r, ((kn + IB(7)) << kMan) | (rn - IB(1 << kMan)));
    if constexpr (!kSecond) {
      const FB v = FB::load_unaligned(x + b * kLanes);
      // v < 0: the sign bit (a -0.0 codes to 0 and takes none)
      c = c | xsimd::select((as_i(as_bits(v)) < IB(0)) & (c != IB(0)), IB(0x80), IB(0));
    }
    as_u(c).store_aligned(code + b * kLanes);
  }
  store_codes(code, out + 1);
}

}  // namespace strata::optim::detail::q8simd
