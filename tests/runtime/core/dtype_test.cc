// Exhaustive round trips over every bf16/fp16 (2^16) and fp8 (2^8) bit pattern, scalar vs
// vectorised (xsimd, TBB) buffer conversion agreement, and the OCP fp8 special cases.
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

#include "runtime/core/dtype.h"
#include "runtime/core/error.h"

using namespace strata;

namespace {

template <class Code> void exhaustive_round_trip(DType t) {
  constexpr std::uint32_t kCount = 1u << (8 * sizeof(Code));
  std::vector<Code> codes(kCount);
  for (std::uint32_t c = 0; c < kCount; ++c) codes[c] = static_cast<Code>(c);
  std::vector<float> decoded(kCount);
  convert(codes.data(), t, decoded.data(), DType::fp32, kCount);
  std::vector<Code> back(kCount);
  convert(decoded.data(), DType::fp32, back.data(), t, kCount, ConvertOptions{false});
  std::size_t nans = 0, mismatches = 0;
  for (std::uint32_t c = 0; c < kCount; ++c) {
    const float scalar = load_as_fp32(codes.data(), t, c);
    if (std::bit_cast<std::uint32_t>(scalar) != std::bit_cast<std::uint32_t>(decoded[c])) ++mismatches;
    if (std::isnan(decoded[c])) {
      ++nans;
      // NaN stays NaN with its sign; the payload becomes the canonical quiet NaN.
      CHECK(std::isnan(load_as_fp32(back.data(), t, c)));
      CHECK(std::signbit(load_as_fp32(back.data(), t, c)) == ((c >> (8 * sizeof(Code) - 1)) & 1u));
    } else if (back[c] != codes[c]) {
      FAIL_CHECK(dtype_name(t) << " code 0x" << std::hex << c << " -> " << decoded[c] << " -> 0x" << +back[c]);
    }
  }
  CHECK(mismatches == 0);
  // NaN encodings per format: bf16 and fp16 2*(2^M - 1), e5m2 2*3, e4m3 exactly 2.
  const auto& info = dtype_info(t);
  const std::size_t want_nans = info.has_inf ? 2 * ((1u << info.man_bits) - 1) : 2;
  CHECK(nans == want_nans);
}

}  // namespace

TEST_CASE("every bf16 bit pattern survives decode and re-encode", "[dtype]") {
  exhaustive_round_trip<std::uint16_t>(DType::bf16);
}
TEST_CASE("every fp16 bit pattern survives decode and re-encode", "[dtype]") {
  exhaustive_round_trip<std::uint16_t>(DType::fp16);
}
TEST_CASE("every fp8 e4m3 bit pattern survives decode and re-encode", "[dtype]") {
  exhaustive_round_trip<std::uint8_t>(DType::fp8_e4m3);
}
TEST_CASE("every fp8 e5m2 bit pattern survives decode and re-encode", "[dtype]") {
  exhaustive_round_trip<std::uint8_t>(DType::fp8_e5m2);
}

TEST_CASE("OCP fp8 special values and overflow rules", "[dtype][boundary]") {
  // e4m3: no infinity; 0x7F is NaN; 0x7E = 448 is the largest finite value.
  CHECK(e4m3_to_fp32(0x7E) == 448.0f);
  CHECK(std::isnan(e4m3_to_fp32(0x7F)));
  CHECK(std::isnan(e4m3_to_fp32(0xFF)));
  CHECK(e4m3_to_fp32(0x78) == 256.0f);  // exponent 1111 with mantissa != 111 is a normal number
  CHECK(e4m3_to_fp32(0x01) == std::ldexp(1.0f, -9));
  CHECK(fp32_to_e4m3(1e6f, true) == 0x7E);
  CHECK(fp32_to_e4m3(-1e6f, true) == 0xFE);
  CHECK(fp32_to_e4m3(INFINITY, true) == 0x7E);
  CHECK(fp32_to_e4m3(1e6f, false) == 0x7F);
  CHECK(fp32_to_e4m3(INFINITY, false) == 0x7F);
  CHECK(fp32_to_e4m3(464.0f, false) == 0x7E);  // tie between 448 and "480": even code wins
  CHECK(fp32_to_e4m3(464.001f, false) == 0x7F);
  // e5m2: IEEE-like.
  CHECK(std::isinf(e5m2_to_fp32(0x7C)));
  CHECK(std::isnan(e5m2_to_fp32(0x7D)));
  CHECK(e5m2_to_fp32(0x7B) == 57344.0f);
  CHECK(fp32_to_e5m2(1e6f, false) == 0x7C);
  CHECK(fp32_to_e5m2(1e6f, true) == 0x7B);
  CHECK(fp32_to_e5m2(-INFINITY, false) == 0xFC);
  // fp16/bf16 overflow to infinity; signed zeros survive.
  CHECK(fp32_to_fp16(65520.0f) == 0x7C00);
  CHECK(fp32_to_fp16(65519.99f) == 0x7BFF);
  CHECK(fp32_to_bf16(-0.0f) == 0x8000);
  CHECK(fp32_to_fp16(-0.0f) == 0x8000);
  CHECK(fp32_to_bf16(std::numeric_limits<float>::max()) == 0x7F80);
}

TEST_CASE("buffer conversion agrees with scalar conversion for every length and pair of dtypes", "[dtype]") {
  const DType from = GENERATE(DType::fp32, DType::bf16, DType::fp16, DType::fp8_e4m3, DType::fp8_e5m2);
  const DType to = GENERATE(DType::fp32, DType::bf16, DType::fp16, DType::fp8_e4m3, DType::fp8_e5m2);
  // Lengths around the batch width and chunk size, and one past TBB's parallel threshold.
  const std::size_t n = GENERATE(std::size_t{0}, 1, 3, 15, 16, 17, 1023, 1024, 1025, 4099, (std::size_t{1} << 20) + 13);
  INFO(dtype_name(from) << " -> " << dtype_name(to) << " n=" << n);
  std::mt19937 rng(static_cast<unsigned>(n * 31 + static_cast<int>(from) * 7 + static_cast<int>(to)));
  std::normal_distribution<float> dist(0.0f, 50.0f);
  std::vector<float> seed(n);
  for (auto& v : seed) v = dist(rng);
  std::vector<std::uint8_t> src(n * dtype_size(from) + 1), dst(n * dtype_size(to) + 1);
  for (std::size_t i = 0; i < n; ++i) store_from_fp32(src.data(), from, i, seed[i]);
  convert(src.data(), from, dst.data(), to, n);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    std::vector<std::uint8_t> one(8);
    store_from_fp32(one.data(), to, 0, load_as_fp32(src.data(), from, i));
    if (std::memcmp(one.data(), dst.data() + i * dtype_size(to), dtype_size(to)) != 0) ++bad;
  }
  CHECK(bad == 0);
}

TEST_CASE("parse_dtype names the bad value and the accepted names", "[dtype][negative]") {
  CHECK(parse_dtype("bfloat16") == DType::bf16);
  CHECK(parse_dtype("E4M3") == DType::fp8_e4m3);
  try {
    (void)parse_dtype("fp12");
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::invalid_argument);
    CHECK_THAT(e.what(), Catch::Contains("'fp12'") && Catch::Contains("bf16"));
  }
}

TEST_CASE("buffer conversion to bf16 and fp16 overflows to inf with default options", "[dtype][regression]") {
  // Broke: convert() passed ConvertOptions::saturate_fp8 (default true) to the 16-bit
  // formats too, so +-inf and overflowing values became the largest finite bf16/fp16, unlike
  // fp32_to_bf16/fp32_to_fp16 and dtype.h's contract; optim's overflow check then missed an
  // Inf gradient stored in bf16/fp16.
  const float inf = std::numeric_limits<float>::infinity();
  for (DType t : {DType::bf16, DType::fp16}) {
    const std::vector<float> src = {inf, -inf, 3.0e38f, -3.0e38f};
    std::vector<std::uint16_t> dst(src.size());
    convert(src.data(), DType::fp32, dst.data(), t, src.size());
    for (std::size_t i = 0; i < src.size(); ++i) {
      const float back = load_as_fp32(dst.data(), t, i);
      const bool overflows = std::fabs(src[i]) > dtype_info(t).max_finite * 1.01f;
      if (overflows || std::isinf(src[i])) CHECK(std::isinf(back));
      const std::uint16_t scalar = t == DType::bf16 ? fp32_to_bf16(src[i]) : fp32_to_fp16(src[i]);
      CHECK(dst[i] == scalar);
    }
  }
}
