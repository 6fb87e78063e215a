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

// Batch b of a block's 16 codes widened to 32-bit lanes, and a block's batches of codes
// (each lane <= 255) narrowed back to 16 bytes.
inline UB load_codes(const std::uint8_t* in, int b) noexcept {
#if XSIMD_WITH_AVX512F
  (void)b;
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in)));
#elif XSIMD_WITH_AVX2
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(in + 8 * b)));
#else
  alignas(64) std::uint32_t c[kLanes];
  for (std::size_t i = 0; i < kLanes; ++i) c[i] = in[b * kLanes + i];
  return UB::load_aligned(c);
#endif
}
inline void store_codes(const UB* c, std::uint8_t* out) noexcept {
#if XSIMD_WITH_AVX512F
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm512_cvtepi32_epi8(c[0]));
#elif XSIMD_WITH_AVX2
  const __m256i words = _mm256_permute4x64_epi64(_mm256_packus_epi32(c[0], c[1]), 0xD8);  // 16 u16 in order
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out),
                   _mm_packus_epi16(_mm256_castsi256_si128(words), _mm256_extracti128_si256(words, 1)));
#else
  for (int b = 0; b < kBatches; ++b) {
    alignas(64) std::uint32_t l[kLanes];
    c[b].store_aligned(l);
    for (std::size_t i = 0; i < kLanes; ++i) out[b * kLanes + i] = static_cast<std::uint8_t>(l[i]);
  }
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

// decode_block(): 16 codes (and the scale byte) to 16 floats at x (64-byte aligned).
template <bool kSecond> inline void decode(const std::uint8_t* in, float* x) noexcept {
  const std::uint8_t s = in[0];
  if (s == 0) {
    for (int i = 0; i < q8::kBlockElems; ++i) x[i] = 0.0f;
    return;
  }
  const FB scale(q8::pow2(static_cast<int>(s) - 127));
  for (int b = 0; b < kBatches; ++b) {
    const UB code = load_codes(in + 1, b);
    FB y;
    if constexpr (kSecond) {
      const FB w = magnitude<4>(code) * scale;
      y = w * w;
    } else {
      y = as_float(as_bits(magnitude<3>(code & UB(0x7f)) * scale) | ((code & UB(0x80)) << 24));
    }
    y.store_aligned(x + b * kLanes);
  }
}

// The lanes' part of dither()'s key: lane x 0x85EBCA6B.
alignas(64) inline constexpr std::uint32_t kLaneKey[q8::kBlockElems] = {
    0x00000000u, 0x85EBCA6Bu, 0x0BD794D6u, 0x91C35F41u, 0x17AF29ACu, 0x9D9AF417u, 0x2386BE82u, 0xA97288EDu,
    0x2F5E5358u, 0xB54A1DC3u, 0x3B35E82Eu, 0xC121B299u, 0x470D7D04u, 0xCCF9476Fu, 0x52E511DAu, 0xD8D0DC45u};

// encode_block() with salt: 16 floats at x (64-byte aligned) to a block at out.
template <bool kSecond>
[[gnu::always_inline]] inline void encode(const float* x, std::uint8_t* out, std::uint32_t salt) noexcept {
  constexpr int kMan = kSecond ? 4 : 3;
  FB mag[kBatches];
  FB top(0.0f);
  for (int b = 0; b < kBatches; ++b) {
    const FB v = FB::load_aligned(x + b * kLanes);
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
  UB code[kBatches];
  for (int b = 0; b < kBatches; ++b) {
    const FB t = mag[b] * inv;  // exact; at most 240 (248): rounds to at most that
    const UB bits = as_bits(t);
    // dither(): mix of the bits, the salt, the lane and the moment
    UB h = bits ^ key ^ UB::load_aligned(kLaneKey + b * kLanes);
    h ^= h >> 16;
    h *= UB(0x7feb352du);
    h ^= h >> 15;
    h *= UB(0x846ca68bu);
    h ^= h >> 16;
    const FB u = xsimd::to_float(as_i(h >> 13)) * FB(1.0f / 524288.0f);
    // round_steps() with the exponent biased: kb = k + 127. A first moment's t has its sign
    // cleared; a second moment of -0.0 has a root of -0.0, whose sign bit must not reach kb.
    const UB ebits = kSecond ? (bits >> 23) & UB(0xffu) : bits >> 23;
    const IB kb = xsimd::max(as_i(ebits), IB(121));
    const FB p = as_float(as_u(IB(kMan + 254) - kb) << 23);  // 2^(man - k)
    IB r;
    if constexpr (kSecond) {  // the step up with the square's probability
      const FB a = t * p;
      const IB r0 = xsimd::to_int(a);
      const FB r0f = xsimd::to_float(r0);
      const FB num = (a - r0f) * (a + r0f), den = r0f + r0f + FB(1.0f);
      r = r0 + xsimd::to_int(xsimd::select(u * den < num, FB(1.0f), FB(0.0f)));
      r = xsimd::max(r, xsimd::min(as_i(bits), IB(1)));  // never zero (t > 0)
    } else {
      r = xsimd::to_int(fmadd(t, p, u));  // t * p is exact, so one rounding as in the scalar form
    }
    // code_of()
    IB c = ((kb - IB(121)) << kMan) + r;
    if constexpr (!kSecond) {
      // v < 0: the sign bit (a -0.0 codes to 0 and takes none)
      const IB sign = as_i((as_bits(FB::load_aligned(x + b * kLanes)) >> 24) & UB(0x80));
      c = c | xsimd::select(c > IB(0), sign, IB(0));
    }
    code[b] = as_u(c);
  }
  store_codes(code, out + 1);
}

}  // namespace strata::optim::detail::q8simd
