// MomentFormat (see moment_format.h): sizes, names and the conversions through fp32.
#include "runtime/core/moment_format.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/core/dtype.h"
#include "runtime/core/error.h"
#include "runtime/core/q8_codec.h"

namespace strata {

const char* moment_format_name(MomentFormat f) noexcept {
  switch (f) {
    case MomentFormat::bf16:
      return "bf16";
    case MomentFormat::q8:
      return "q8";
    default:
      return "fp32";
  }
}

MomentFormat parse_moment_format(std::string_view text) {
  if (text == "fp32") return MomentFormat::fp32;
  if (text == "bf16") return MomentFormat::bf16;
  if (text == "q8") return MomentFormat::q8;
  STRATA_THROW(Errc::invalid_argument, "moment format '", std::string(text), "' is not known: use fp32, bf16 or q8");
}

double moment_bytes_per_elem(MomentFormat f) noexcept {
  return f == MomentFormat::q8 ? double(q8::kBlockBytes) / q8::kBlockElems : f == MomentFormat::bf16 ? 2.0 : 4.0;
}

std::size_t moment_align(MomentFormat f) noexcept { return f == MomentFormat::q8 ? q8::kBlockElems : 1; }

std::size_t moment_bytes(MomentFormat f, std::size_t n) noexcept {
  if (f == MomentFormat::q8) return (n + q8::kBlockElems - 1) / q8::kBlockElems * q8::kBlockBytes;
  return n * (f == MomentFormat::bf16 ? 2 : 4);
}

std::size_t moment_offset(MomentFormat f, std::size_t elem) {
  STRATA_CHECK(elem % moment_align(f) == 0, Errc::invalid_argument, "element ", elem, " cuts a ", moment_format_name(f),
               " moment array inside a block of ", moment_align(f), " elements");
  return moment_bytes(f, elem);
}

void moments_to_fp32(const void* src, MomentFormat f, Moment which, float* dst, std::size_t n) {
  if (f != MomentFormat::q8) {
    convert(src, f == MomentFormat::bf16 ? DType::bf16 : DType::fp32, dst, DType::fp32, n);
    return;
  }
  const auto* in = static_cast<const std::uint8_t*>(src);
  float block[q8::kBlockElems];
  for (std::size_t i = 0; i < n; i += q8::kBlockElems, in += q8::kBlockBytes) {
    q8::decode_block(in, block, which == Moment::second);
    std::memcpy(dst + i, block, sizeof(float) * std::min<std::size_t>(q8::kBlockElems, n - i));
  }
}

void moments_range_to_fp32(const void* array, MomentFormat f, Moment which, std::size_t first, std::size_t count,
                           float* dst) {
  const std::size_t align = moment_align(f), lane = first % align;
  const auto* base = static_cast<const std::uint8_t*>(array) + moment_bytes(f, first - lane);
  if (lane == 0) {
    moments_to_fp32(base, f, which, dst, count);
    return;
  }
  std::vector<float> tmp(lane + count);
  moments_to_fp32(base, f, which, tmp.data(), tmp.size());
  std::memcpy(dst, tmp.data() + lane, count * sizeof(float));
}

void moments_from_fp32(const float* src, void* dst, MomentFormat f, Moment which, std::size_t n) {
  if (f != MomentFormat::q8) {
    convert(src, DType::fp32, dst, f == MomentFormat::bf16 ? DType::bf16 : DType::fp32, n);
    return;
  }
  auto* out = static_cast<std::uint8_t*>(dst);
  float block[q8::kBlockElems];
  for (std::size_t i = 0; i < n; i += q8::kBlockElems, out += q8::kBlockBytes) {
    const std::size_t len = std::min<std::size_t>(q8::kBlockElems, n - i);
    std::memset(block, 0, sizeof block);
    std::memcpy(block, src + i, sizeof(float) * len);
    q8::encode_block(block, out, which == Moment::second, 0);
  }
}

}  // namespace strata
