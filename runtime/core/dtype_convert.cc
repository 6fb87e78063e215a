// Buffer conversions between dtypes with xsimd batches (the rules live in
// detail/small_float.h, their batch form in simd_convert.h). Work proceeds in chunks of
// kChunk elements through an aligned uint32 scratch so loads, the batch transform and the
// narrowing stores stay simple; large buffers are split over TBB workers (the body cannot
// throw).
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cstring>
#include <xsimd/xsimd.hpp>

#include "runtime/core/dtype.h"
#include "runtime/core/simd_convert.h"

namespace strata {
namespace {

using detail::SmallFloat;
using simd::BF;
using simd::BU;
using simd::decode_batch;
using simd::encode_batch;

constexpr std::size_t kLanes = BU::size;
constexpr std::size_t kChunk = 1024;  // multiple of every batch width
constexpr std::size_t kParallelMin = std::size_t{1} << 20;
constexpr std::size_t kGrain = std::size_t{1} << 16;

const SmallFloat& format_of(DType t) { return simd::small_format(t); }

template <class Code> void encode_span(const SmallFloat& f, const float* src, Code* dst, std::size_t n, bool saturate) {
  alignas(64) std::uint32_t tmp[kChunk];
  for (std::size_t i = 0; i < n; i += kChunk) {
    const std::size_t len = std::min(kChunk, n - i);
    std::size_t j = 0;
    for (; j + kLanes <= len; j += kLanes) {
      const BU u = xsimd::bitwise_cast<BU>(BF::load_unaligned(src + i + j));
      encode_batch(f, u, saturate).store_aligned(tmp + j);
    }
    if (j < len) {
      alignas(64) float pad[kLanes] = {};
      std::memcpy(pad, src + i + j, (len - j) * sizeof(float));
      encode_batch(f, xsimd::bitwise_cast<BU>(BF::load_aligned(pad)), saturate).store_aligned(tmp + j);
    }
    for (std::size_t k = 0; k < len; ++k) dst[i + k] = static_cast<Code>(tmp[k]);
  }
}

template <class Code> void decode_span(const SmallFloat& f, const Code* src, float* dst, std::size_t n) {
  alignas(64) std::uint32_t tmp[kChunk];
  for (std::size_t i = 0; i < n; i += kChunk) {
    const std::size_t len = std::min(kChunk, n - i);
    for (std::size_t k = 0; k < len; ++k) tmp[k] = src[i + k];
    std::size_t j = 0;
    for (; j + kLanes <= len; j += kLanes) {
      xsimd::bitwise_cast<BF>(decode_batch(f, BU::load_aligned(tmp + j))).store_unaligned(dst + i + j);
    }
    if (j < len) {
      alignas(64) float pad[kLanes];
      for (std::size_t k = len; k < j + kLanes; ++k) tmp[k] = 0;
      xsimd::bitwise_cast<BF>(decode_batch(f, BU::load_aligned(tmp + j))).store_aligned(pad);
      std::memcpy(dst + i + j, pad, (len - j) * sizeof(float));
    }
  }
}

// encode_span for bf16 through the five-operation encoder (simd_convert.h; the same codes for
// all 2^32 inputs), narrowed to 16 bits in registers: the general rule's subnormal and
// saturation selects, and a scalar narrowing loop, cost a third of a gradient accumulator's
// pass and a fifth of a small GPT's bf16 step.
void bf16_encode_span(const float* src, std::uint16_t* dst, std::size_t n) {
  std::size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    simd::store_u16<false>(dst + i, simd::encode_bf16_batch(xsimd::bitwise_cast<BU>(BF::load_unaligned(src + i))));
  if (i < n) {
    alignas(64) float pad[kLanes] = {};
    alignas(64) std::uint32_t codes[kLanes];
    std::memcpy(pad, src + i, (n - i) * sizeof(float));
    simd::encode_bf16_batch(xsimd::bitwise_cast<BU>(BF::load_aligned(pad))).store_aligned(codes);
    for (std::size_t k = 0; i + k < n; ++k) dst[i + k] = static_cast<std::uint16_t>(codes[k]);
  }
}

void bf16_decode_span(const std::uint16_t* src, float* dst, std::size_t n) {
  std::size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) xsimd::bitwise_cast<BF>(simd::load_u16(src + i) << 16).store_unaligned(dst + i);
  for (; i < n; ++i) {
    const std::uint32_t bits = static_cast<std::uint32_t>(src[i]) << 16;
    std::memcpy(dst + i, &bits, sizeof bits);
  }
}

// `saturate` is ConvertOptions::saturate_fp8: bf16 and fp16 always overflow to inf, as IEEE
// (and as the scalar fp32_to_bf16/fp32_to_fp16 do).
void from_fp32(const float* src, DType to, void* dst, std::size_t n, bool saturate) {
  if (to == DType::bf16)
    bf16_encode_span(src, static_cast<std::uint16_t*>(dst), n);
  else if (dtype_size(to) == 2)
    encode_span(format_of(to), src, static_cast<std::uint16_t*>(dst), n, false);
  else
    encode_span(format_of(to), src, static_cast<std::uint8_t*>(dst), n, saturate);
}

void to_fp32(const void* src, DType from, float* dst, std::size_t n) {
  if (from == DType::bf16)
    bf16_decode_span(static_cast<const std::uint16_t*>(src), dst, n);
  else if (dtype_size(from) == 2)
    decode_span(format_of(from), static_cast<const std::uint16_t*>(src), dst, n);
  else
    decode_span(format_of(from), static_cast<const std::uint8_t*>(src), dst, n);
}

void convert_serial(const void* src, DType from, void* dst, DType to, std::size_t n, bool saturate) {
  if (from == DType::fp32) {
    from_fp32(static_cast<const float*>(src), to, dst, n, saturate);
  } else if (to == DType::fp32) {
    to_fp32(src, from, static_cast<float*>(dst), n);
  } else {
    float mid[kChunk];
    const auto* s = static_cast<const unsigned char*>(src);
    auto* d = static_cast<unsigned char*>(dst);
    for (std::size_t i = 0; i < n; i += kChunk) {
      const std::size_t len = std::min(kChunk, n - i);
      to_fp32(s + i * dtype_size(from), from, mid, len);
      from_fp32(mid, to, d + i * dtype_size(to), len, saturate);
    }
  }
}

}  // namespace

void convert(const void* src, DType from, void* dst, DType to, std::size_t count, ConvertOptions options) {
  if (count == 0) return;
  if (from == to) {
    if (src != dst) std::memmove(dst, src, count * dtype_size(from));
    return;
  }
  const auto* s = static_cast<const unsigned char*>(src);
  auto* d = static_cast<unsigned char*>(dst);
  const std::size_t sb = dtype_size(from), db = dtype_size(to);
  if (count < kParallelMin) {
    convert_serial(src, from, dst, to, count, options.saturate_fp8);
    return;
  }
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, count, kGrain), [&](const tbb::blocked_range<std::size_t>& r) {
    convert_serial(s + r.begin() * sb, from, d + r.begin() * db, to, r.size(), options.saturate_fp8);
  });
}

}  // namespace strata
