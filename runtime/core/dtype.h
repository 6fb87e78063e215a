// Element types and conversions. fp32, bf16, fp16 (IEEE binary16) and the two OCP FP8
// formats: e4m3 (bias 7, no infinity, NaN only at S.1111.111, max 448) and e5m2 (bias 15,
// IEEE-like with inf and NaN, max 57344). Conversion from fp32 rounds to nearest even.
// fp8 overflow saturates to the largest finite value by default (Transformer Engine's and
// CUDA's __NV_SATFINITE behaviour); with saturate_fp8 = false it follows the OCP
// non-saturating rule: e4m3 gives NaN, e5m2 gives inf. bf16/fp16 overflow to inf, as IEEE.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace strata {

enum class DType : std::uint8_t { fp32, bf16, fp16, fp8_e4m3, fp8_e5m2 };

struct DTypeInfo {
  const char* name;   // "fp32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2"
  std::size_t bytes;  // storage bytes per element
  int exp_bits;
  int man_bits;
  int bias;
  bool has_inf;  // e4m3 has none
  float max_finite;
};

const DTypeInfo& dtype_info(DType t) noexcept;
inline std::size_t dtype_size(DType t) noexcept { return dtype_info(t).bytes; }
inline const char* dtype_name(DType t) noexcept { return dtype_info(t).name; }
// Accepts the names above plus common aliases (float32, bfloat16, half, e4m3, ...); throws
// Errc::invalid_argument naming the text and the accepted names.
DType parse_dtype(std::string_view text);

// Scalar conversions (bit patterns in, bit patterns out).
std::uint16_t fp32_to_bf16(float x) noexcept;
std::uint16_t fp32_to_fp16(float x) noexcept;
std::uint8_t fp32_to_e4m3(float x, bool saturate = true) noexcept;
std::uint8_t fp32_to_e5m2(float x, bool saturate = true) noexcept;
float bf16_to_fp32(std::uint16_t bits) noexcept;
float fp16_to_fp32(std::uint16_t bits) noexcept;
float e4m3_to_fp32(std::uint8_t bits) noexcept;
float e5m2_to_fp32(std::uint8_t bits) noexcept;

// Any dtype to fp32 and back for one element at `index` of a typed buffer.
float load_as_fp32(const void* base, DType t, std::size_t index) noexcept;
void store_from_fp32(void* base, DType t, std::size_t index, float value, bool saturate_fp8 = true) noexcept;

struct ConvertOptions {
  bool saturate_fp8 = true;
};

// Buffer conversion between any two dtypes (through fp32 when neither side is fp32).
// Vectorised with xsimd; buffers above ~1M elements are split across TBB workers. src and
// dst must not overlap unless they are the same pointer with the same dtype.
void convert(const void* src, DType from, void* dst, DType to, std::size_t count, ConvertOptions options = {});

}  // namespace strata
