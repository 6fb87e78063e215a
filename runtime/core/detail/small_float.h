// The bit-level rules for fp32 <-> small binary floats, written once as templates over the
// integer type U (std::uint32_t for scalars, xsimd::batch<uint32_t> for vectors) so the
// scalar and vector paths cannot drift apart. Private to runtime/core.
//
// Encoding |x| (fp32 bits a) into a format with E exponent bits, M mantissa bits, bias B:
// - a below the target's smallest normal: add the "magic" float 2^(emin - M + 23), whose
//   ULP equals the target's subnormal ULP; the FPU's round-to-nearest-even does the
//   rounding, and the magic's bits subtracted leave the subnormal code (2^M = min normal).
// - otherwise: rebias the exponent, add half an ULP minus one plus the ULP's lowest kept
//   bit (ties to even), shift. A carry out of the mantissa bumps the exponent, as it must.
// - codes above the largest finite code overflow: saturate, or inf/NaN per the format.
// The FPU must not flush subnormals (no FTZ/DAZ), which is the default on x86-64.
#pragma once

#include <cstdint>

namespace strata::detail {

struct SmallFloat {
  int exp_bits;
  int man_bits;
  int bias;
  bool has_inf;
  std::uint32_t max_code;  // largest finite magnitude code
  std::uint32_t nan_code;  // canonical quiet NaN magnitude code
  std::uint32_t inf_code;  // infinity magnitude code (== nan_code where there is none)

  constexpr int sign_shift() const { return exp_bits + man_bits; }
  constexpr int shift() const { return 23 - man_bits; }
  constexpr int emin() const { return 1 - bias; }
  constexpr std::uint32_t min_normal_bits() const { return static_cast<std::uint32_t>(emin() + 127) << 23; }
  constexpr std::uint32_t magic_bits() const { return static_cast<std::uint32_t>(emin() - man_bits + 23 + 127) << 23; }
  constexpr std::uint32_t rebias_round() const {
    return (static_cast<std::uint32_t>(bias - 127) << 23) + ((1u << (shift() - 1)) - 1);
  }
  constexpr std::uint32_t exp_mask() const { return (1u << exp_bits) - 1; }
  constexpr std::uint32_t man_mask() const { return (1u << man_bits) - 1; }
};

constexpr SmallFloat make_ieee(int e, int m, int bias) {
  const std::uint32_t all_exp = ((1u << e) - 1) << m;
  return {e, m, bias, true, all_exp - 1, all_exp | (1u << (m - 1)), all_exp};
}
inline constexpr SmallFloat kBF16 = make_ieee(8, 7, 127);
inline constexpr SmallFloat kFP16 = make_ieee(5, 10, 15);
inline constexpr SmallFloat kE5M2 = make_ieee(5, 2, 15);
// OCP e4m3: exponent 1111 is a normal binade except mantissa 111, which is NaN.
inline constexpr SmallFloat kE4M3 = {4, 3, 7, false, 0x7E, 0x7F, 0x7F};

inline std::uint32_t encode_scalar(const SmallFloat& f, std::uint32_t u, bool saturate) noexcept {
  const std::uint32_t sign = (u >> 31) << f.sign_shift();
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | f.nan_code;
  std::uint32_t r;
  if (a < f.min_normal_bits()) {
    float x, magic;
    const std::uint32_t mb = f.magic_bits();
    __builtin_memcpy(&x, &a, 4);
    __builtin_memcpy(&magic, &mb, 4);
    float sum = x + magic;
    std::uint32_t sb;
    __builtin_memcpy(&sb, &sum, 4);
    r = sb - mb;
  } else {
    const std::uint32_t odd = (a >> f.shift()) & 1u;
    r = (a + f.rebias_round() + odd) >> f.shift();
  }
  if (r > f.max_code) r = saturate ? f.max_code : f.inf_code;
  return sign | r;
}

inline std::uint32_t decode_scalar(const SmallFloat& f, std::uint32_t c) noexcept {
  const std::uint32_t sign = ((c >> f.sign_shift()) & 1u) << 31;
  const std::uint32_t mag = c & ((1u << f.sign_shift()) - 1);
  const std::uint32_t e = mag >> f.man_bits;
  const std::uint32_t m = mag & f.man_mask();
  if (f.has_inf && e == f.exp_mask()) {
    return sign | 0x7f800000u | (m << f.shift()) | (m ? 0x00400000u : 0u);
  }
  if (!f.has_inf && mag == f.nan_code) return sign | 0x7fc00000u;
  if (e == 0) {
    // m * 2^(emin - M): the magic float with m in its low mantissa bits, minus the magic.
    const std::uint32_t mb = f.magic_bits();
    const std::uint32_t xb = mb | m;
    float x, magic;
    __builtin_memcpy(&x, &xb, 4);
    __builtin_memcpy(&magic, &mb, 4);
    float v = x - magic;
    std::uint32_t vb;
    __builtin_memcpy(&vb, &v, 4);
    return sign | vb;
  }
  return sign | ((e + static_cast<std::uint32_t>(127 - f.bias)) << 23) | (m << f.shift());
}

}  // namespace strata::detail
