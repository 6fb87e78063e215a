// Loads and stores of one batch of optimizer-state lanes in any supported storage dtype, for
// the fused CPU kernels. fp32 lanes map to memory 1:1; bf16/fp16 are widened from and
// narrowed to 16-bit codes with the ISA's zero-extend/truncate instructions (AVX-512BW,
// AVX2) or a small scratch array (portable builds). Rounding is strata's own RNE rule
// (runtime/core/simd_convert.h), so a kernel rounds exactly as strata::convert does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <xsimd/xsimd.hpp>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "runtime/core/dtype.h"
#include "runtime/core/simd_convert.h"

namespace strata::optim::detail {

using FB = xsimd::batch<float>;
using UB = xsimd::batch<std::uint32_t>;
inline constexpr std::size_t kLanes = FB::size;
// Bytes one batch of 16-bit codes occupies: a non-temporal store of it needs this alignment.
inline constexpr std::size_t kHalfBatchBytes = kLanes * sizeof(std::uint16_t);

// Widening and narrowing of 16-bit codes (the ISA's zero-extend/truncate) live beside the
// rounding rules, which the conversions in runtime/core use too.
using simd::load_u16;
using simd::store_u16;

// a * b + c with one rounding wherever the ISA has FMA. xsimd 8.1 has no AVX-512 kernel for
// xsimd::fma and falls back to a * b + c (two roundings, two instructions), so AVX-512 builds
// call the intrinsic; AVX2 builds get xsimd's fma3 kernel; an SSE2-only (portable) build has
// no FMA unit and rounds twice, which the tests' reference bounds allow for.
inline FB fmadd(const FB& a, const FB& b, const FB& c) noexcept {
#if XSIMD_WITH_AVX512F
  return _mm512_fmadd_ps(a, b, c);
#else
  return xsimd::fma(a, b, c);
#endif
}

template <bool kNonTemporal> inline void store_f32(float* p, const FB& x) noexcept {
#if XSIMD_WITH_AVX512F
  if constexpr (kNonTemporal) {
    _mm512_stream_ps(p, x);
    return;
  }
#elif XSIMD_WITH_AVX
  if constexpr (kNonTemporal) {
    _mm256_stream_ps(p, x);
    return;
  }
#endif
  x.store_unaligned(p);
}

// Element i.. i+kLanes-1 of a buffer of dtype T, as fp32 lanes.
template <DType T> inline FB load_lanes(const void* base, std::size_t i) noexcept {
  if constexpr (T == DType::fp32) {
    return FB::load_unaligned(static_cast<const float*>(base) + i);
  } else if constexpr (T == DType::bf16) {
    return xsimd::bitwise_cast<FB>(load_u16(static_cast<const std::uint16_t*>(base) + i) << 16);
  } else {
    static_assert(T == DType::fp16, "optimizer buffers are fp32, bf16 or fp16");
    return xsimd::bitwise_cast<FB>(
        simd::decode_batch(strata::detail::kFP16, load_u16(static_cast<const std::uint16_t*>(base) + i)));
  }
}

// Rounds fp32 lanes to dtype T (nearest even; bf16/fp16 overflow to inf) and stores them.
template <DType T, bool kNonTemporal = false> inline void store_lanes(void* base, std::size_t i, const FB& x) noexcept {
  if constexpr (T == DType::fp32) {
    store_f32<kNonTemporal>(static_cast<float*>(base) + i, x);
  } else {
    static_assert(T == DType::bf16 || T == DType::fp16, "optimizer buffers are fp32, bf16 or fp16");
    const UB bits = xsimd::bitwise_cast<UB>(x);
    store_u16<kNonTemporal>(static_cast<std::uint16_t*>(base) + i,
                            T == DType::bf16 ? simd::encode_bf16_batch(bits)
                                             : simd::encode_batch(strata::detail::kFP16, bits, /*saturate=*/false));
  }
}

// Orders this thread's non-temporal stores before whatever it does next (they are weakly
// ordered, and TBB's release of a finished task does not order them on x86).
inline void fence_streaming_stores() noexcept {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

}  // namespace strata::optim::detail
