// fp32 -> bf16/fp16/fp8 rounding checked against a brute-force reference: enumerate every
// finite non-negative value of the target format, find the nearest to |x| (ties to the
// even code), treat one step past the largest finite value as overflow. Inputs: every
// midpoint between neighbours (exact ties) and its float neighbours, random bit patterns,
// random values in range, and specials. Scalar and buffer conversions must both agree.
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

#include "runtime/core/dtype.h"

using namespace strata;

namespace {

struct Format {
  DType type;
  int code_bits;               // 16 or 8
  std::vector<double> values;  // finite non-negative values, ascending, index = code
  std::uint32_t max_code;
  bool has_inf;
  std::uint32_t sign_bit;
};

Format make_format(DType t) {
  Format f{t, static_cast<int>(dtype_size(t) * 8), {}, 0, dtype_info(t).has_inf, 0};
  f.sign_bit = 1u << (f.code_bits - 1);
  for (std::uint32_t code = 0; code < f.sign_bit; ++code) {
    float v;
    if (t == DType::bf16)
      v = bf16_to_fp32(static_cast<std::uint16_t>(code));
    else if (t == DType::fp16)
      v = fp16_to_fp32(static_cast<std::uint16_t>(code));
    else if (t == DType::fp8_e4m3)
      v = e4m3_to_fp32(static_cast<std::uint8_t>(code));
    else
      v = e5m2_to_fp32(static_cast<std::uint8_t>(code));
    if (!std::isfinite(v)) break;  // codes ascend with value up to the first inf/NaN code
    f.values.push_back(v);
    f.max_code = code;
  }
  return f;
}

// The expected code for x, or -1 for "any NaN".
std::int64_t reference(const Format& f, float x, bool saturate) {
  if (std::isnan(x)) return -1;
  const std::uint32_t sign = std::signbit(x) ? f.sign_bit : 0;
  const double a = std::fabs(static_cast<double>(x));
  const double top = f.values.back();
  const double ulp_top = top - f.values[f.values.size() - 2];
  const double virtual_next = top + ulp_top;  // where the next code would be
  auto overflow = [&]() -> std::int64_t {
    if (saturate) return sign | f.max_code;
    if (f.has_inf) return sign | (f.max_code + 1);  // inf code follows the largest finite
    return -1;                                      // e4m3: NaN
  };
  if (std::isinf(a)) return overflow();
  if (a >= virtual_next) return overflow();
  if (a > top) {
    // Between the largest finite value and the virtual next: nearest, tie to even code.
    const double dl = a - top, dh = virtual_next - a;
    const bool next_even = ((f.max_code + 1) & 1u) == 0;
    if (dl < dh || (dl == dh && !next_even)) return sign | f.max_code;
    return overflow();
  }
  auto it = std::lower_bound(f.values.begin(), f.values.end(), a);
  const std::uint32_t hi = static_cast<std::uint32_t>(it - f.values.begin());
  if (f.values[hi] == a) return sign | hi;
  const std::uint32_t lo = hi - 1;
  const double dl = a - f.values[lo], dh = f.values[hi] - a;
  if (dl < dh) return sign | lo;
  if (dh < dl) return sign | hi;
  return sign | ((lo & 1u) == 0 ? lo : hi);
}

std::uint32_t scalar_encode(DType t, float x, bool saturate) {
  switch (t) {
    case DType::bf16:
      return fp32_to_bf16(x);
    case DType::fp16:
      return fp32_to_fp16(x);
    case DType::fp8_e4m3:
      return fp32_to_e4m3(x, saturate);
    default:
      return fp32_to_e5m2(x, saturate);
  }
}

bool is_nan_code(const Format& f, std::uint32_t code) { return std::isnan(load_as_fp32(&code, f.type, 0)); }

void check_inputs(const Format& f, const std::vector<float>& inputs, bool saturate) {
  std::vector<std::uint8_t> out(inputs.size() * dtype_size(f.type));
  ConvertOptions opt;
  opt.saturate_fp8 = saturate;
  convert(inputs.data(), DType::fp32, out.data(), f.type, inputs.size(), opt);
  std::size_t failures = 0;
  for (std::size_t i = 0; i < inputs.size() && failures < 10; ++i) {
    const float x = inputs[i];
    const std::uint32_t scalar = scalar_encode(f.type, x, saturate);
    std::uint32_t buffer = 0;
    std::memcpy(&buffer, out.data() + i * dtype_size(f.type), dtype_size(f.type));
    const std::int64_t want = reference(f, x, saturate);
    const bool ok_scalar = want < 0 ? is_nan_code(f, scalar) : scalar == static_cast<std::uint32_t>(want);
    if (!ok_scalar || buffer != scalar) {
      ++failures;
      UNSCOPED_INFO(dtype_name(f.type) << " x=" << x << " (bits 0x" << std::hex << std::bit_cast<std::uint32_t>(x)
                                       << ") want 0x" << want << " scalar 0x" << scalar << " buffer 0x" << buffer
                                       << std::dec << " saturate=" << saturate);
      CHECK(false);
    }
  }
  CHECK(failures == 0);
}

std::vector<float> midpoints_and_neighbours(const Format& f) {
  std::vector<float> xs;
  for (std::size_t i = 0; i + 1 < f.values.size(); ++i) {
    const float mid = static_cast<float>(0.5 * (f.values[i] + f.values[i + 1]));
    REQUIRE(static_cast<double>(mid) == 0.5 * (f.values[i] + f.values[i + 1]));  // exact tie in fp32
    for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY), static_cast<float>(f.values[i])}) {
      xs.push_back(x);
      xs.push_back(-x);
    }
  }
  const double top = f.values.back(), ulp = top - f.values[f.values.size() - 2];
  for (double v : {top + ulp / 2, top + ulp / 4, top + ulp, top * 4}) {
    const float x = static_cast<float>(v);
    for (float y : {x, std::nextafter(x, 0.0f), std::nextafter(x, INFINITY)}) {
      xs.push_back(y);
      xs.push_back(-y);
    }
  }
  return xs;
}

std::vector<float> random_inputs(const Format& f, std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> xs;
  xs.reserve(n + 16);
  for (std::size_t i = 0; i < n / 2; ++i) xs.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(rng())));
  const double lo = std::log2(f.values[1]) - 2, hi = std::log2(f.values.back()) + 1;
  std::uniform_real_distribution<double> e(lo, hi);
  for (std::size_t i = 0; i < n / 2; ++i) {
    const float v = static_cast<float>(std::exp2(e(rng)));
    xs.push_back(rng() & 1 ? v : -v);
  }
  const float specials[] = {0.0f,
                            -0.0f,
                            INFINITY,
                            -INFINITY,
                            std::numeric_limits<float>::quiet_NaN(),
                            -std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::denorm_min(),
                            std::numeric_limits<float>::min(),
                            std::numeric_limits<float>::max(),
                            -std::numeric_limits<float>::max(),
                            std::bit_cast<float>(0x7f800001u),
                            std::bit_cast<float>(0xffbfffffu)};
  xs.insert(xs.end(), std::begin(specials), std::end(specials));
  return xs;
}

}  // namespace

TEST_CASE("fp32 to low precision rounds to nearest even exactly as the brute-force reference", "[dtype]") {
  const DType t = GENERATE(DType::bf16, DType::fp16, DType::fp8_e4m3, DType::fp8_e5m2);
  const bool saturate = GENERATE(true, false);
  if (!saturate && (t == DType::bf16 || t == DType::fp16)) return;  // IEEE types never saturate
  INFO(dtype_name(t) << " saturate=" << saturate);
  const Format f = make_format(t);
  const bool saturating_format = t == DType::fp8_e4m3 || t == DType::fp8_e5m2;
  const bool sat = saturating_format && saturate;
  SECTION("every tie, its neighbours and every representable value") {
    check_inputs(f, midpoints_and_neighbours(f), sat);
  }
  SECTION("random bit patterns and random in-range values") {
    check_inputs(f, random_inputs(f, 200000, 42 + static_cast<int>(t)), sat);
  }
}

TEST_CASE("format tables agree with the OCP and IEEE definitions", "[dtype]") {
  CHECK(make_format(DType::fp8_e4m3).values.back() == 448.0);
  CHECK(make_format(DType::fp8_e4m3).max_code == 0x7E);
  CHECK(make_format(DType::fp8_e5m2).values.back() == 57344.0);
  CHECK(make_format(DType::fp16).values.back() == 65504.0);
  CHECK(make_format(DType::fp16).values[1] == std::ldexp(1.0, -24));
  CHECK(make_format(DType::fp8_e4m3).values[1] == std::ldexp(1.0, -9));
  CHECK(make_format(DType::fp8_e5m2).values[1] == std::ldexp(1.0, -16));
  CHECK(make_format(DType::bf16).values[1] == std::ldexp(1.0, -133));
  for (DType t : {DType::bf16, DType::fp16, DType::fp8_e4m3, DType::fp8_e5m2}) {
    CHECK(static_cast<float>(make_format(t).values.back()) == dtype_info(t).max_finite);
  }
}
