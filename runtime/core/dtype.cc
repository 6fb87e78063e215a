// DType metadata and the scalar fp32 <-> low-precision conversions. The scalar code is the
// readable statement of the rounding rules; dtype_convert.cc applies the same rules with
// xsimd batches, and tests check both against a brute-force nearest-value reference.
#include "runtime/core/dtype.h"

#include <bit>
#include <cstring>
#include <string>

#include "runtime/core/detail/small_float.h"
#include "runtime/core/error.h"

namespace strata {

namespace {
const DTypeInfo kInfo[] = {
    {"fp32", 4, 8, 23, 127, true, 3.40282347e38f}, {"bf16", 2, 8, 7, 127, true, 3.38953139e38f},
    {"fp16", 2, 5, 10, 15, true, 65504.0f},        {"fp8_e4m3", 1, 4, 3, 7, false, 448.0f},
    {"fp8_e5m2", 1, 5, 2, 15, true, 57344.0f},
};
}  // namespace

const DTypeInfo& dtype_info(DType t) noexcept { return kInfo[static_cast<int>(t)]; }

DType parse_dtype(std::string_view text) {
  std::string s(text);
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (s == "fp32" || s == "float32" || s == "float" || s == "f32") return DType::fp32;
  if (s == "bf16" || s == "bfloat16") return DType::bf16;
  if (s == "fp16" || s == "float16" || s == "half" || s == "f16") return DType::fp16;
  if (s == "fp8_e4m3" || s == "e4m3" || s == "float8_e4m3fn" || s == "fp8-e4m3") return DType::fp8_e4m3;
  if (s == "fp8_e5m2" || s == "e5m2" || s == "float8_e5m2" || s == "fp8-e5m2") return DType::fp8_e5m2;
  STRATA_THROW(Errc::invalid_argument, "dtype '", text, "' is not known: use fp32, bf16, fp16, fp8_e4m3 or fp8_e5m2");
}

using detail::kBF16;
using detail::kE4M3;
using detail::kE5M2;
using detail::kFP16;

std::uint16_t fp32_to_bf16(float x) noexcept {
  return static_cast<std::uint16_t>(detail::encode_scalar(kBF16, std::bit_cast<std::uint32_t>(x), false));
}
std::uint16_t fp32_to_fp16(float x) noexcept {
  return static_cast<std::uint16_t>(detail::encode_scalar(kFP16, std::bit_cast<std::uint32_t>(x), false));
}
std::uint8_t fp32_to_e4m3(float x, bool saturate) noexcept {
  return static_cast<std::uint8_t>(detail::encode_scalar(kE4M3, std::bit_cast<std::uint32_t>(x), saturate));
}
std::uint8_t fp32_to_e5m2(float x, bool saturate) noexcept {
  return static_cast<std::uint8_t>(detail::encode_scalar(kE5M2, std::bit_cast<std::uint32_t>(x), saturate));
}
float bf16_to_fp32(std::uint16_t b) noexcept { return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16); }
float fp16_to_fp32(std::uint16_t b) noexcept { return std::bit_cast<float>(detail::decode_scalar(kFP16, b)); }
float e4m3_to_fp32(std::uint8_t b) noexcept { return std::bit_cast<float>(detail::decode_scalar(kE4M3, b)); }
float e5m2_to_fp32(std::uint8_t b) noexcept { return std::bit_cast<float>(detail::decode_scalar(kE5M2, b)); }

float load_as_fp32(const void* base, DType t, std::size_t i) noexcept {
  switch (t) {
    case DType::fp32:
      return static_cast<const float*>(base)[i];
    case DType::bf16:
      return bf16_to_fp32(static_cast<const std::uint16_t*>(base)[i]);
    case DType::fp16:
      return fp16_to_fp32(static_cast<const std::uint16_t*>(base)[i]);
    case DType::fp8_e4m3:
      return e4m3_to_fp32(static_cast<const std::uint8_t*>(base)[i]);
    case DType::fp8_e5m2:
      return e5m2_to_fp32(static_cast<const std::uint8_t*>(base)[i]);
  }
  return 0.0f;
}

void store_from_fp32(void* base, DType t, std::size_t i, float v, bool saturate_fp8) noexcept {
  switch (t) {
    case DType::fp32:
      static_cast<float*>(base)[i] = v;
      break;
    case DType::bf16:
      static_cast<std::uint16_t*>(base)[i] = fp32_to_bf16(v);
      break;
    case DType::fp16:
      static_cast<std::uint16_t*>(base)[i] = fp32_to_fp16(v);
      break;
    case DType::fp8_e4m3:
      static_cast<std::uint8_t*>(base)[i] = fp32_to_e4m3(v, saturate_fp8);
      break;
    case DType::fp8_e5m2:
      static_cast<std::uint8_t*>(base)[i] = fp32_to_e5m2(v, saturate_fp8);
      break;
  }
}

}  // namespace strata
