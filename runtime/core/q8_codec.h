// The q8 optimizer-moment block: 16 elements in 17 bytes, one power-of-two scale byte and
// sixteen 8-bit codes. Plain inline C++17 (no std::bit_cast): nvcc compiles it for the CUDA
// optimizer, so both kernels code a block to the same bits.
//
// A block is [s | c0 .. c15]. s = 0: every element is zero. Otherwise the scale is 2^(s - 127)
// and element i is decode(ci) x 2^(s - 127), where the code is
//   first moment (exp_avg, signed):       OCP FP8 e4m3 (bias 7, subnormals, max 448);
//   second moment (exp_avg_sq, >= 0):     the square root of the value, in an unsigned
//                                         e4m4 (bias 7, subnormals down to 2^-10, max 496),
//                                         so the stored value is (decode(c) x 2^(s-127))^2.
// The scale puts the block's largest magnitude (largest square root) in [128, 240] ([128,
// 248]), or in (120, 128) (124, 128) where it is larger: the largest code below 256, so no
// value can round up out of the scale's range and none is clamped (a clamp would bias it).
// A decoded block codes back to the same values for any salt (every value is on the grid: a
// block whose largest value is 240 or 248 may come back at the finer scale), so training
// from decoded moments, a checkpoint's, goes on bit for bit; 2^-9 (2^-10) of the scale is the
// smallest nonzero step.
// Rounding is stochastic: the value lands on one of the two neighbouring codes with
// probabilities that make its expectation exact, so the long memory of beta2 = 0.999 is kept
// (round to nearest would freeze a second moment whose per-step change is below half a step).
// For the second moment the probabilities are those of the square (the stored value), not of
// the root: a root rounded without bias squares to v plus the rounding's variance, a bias of
// up to 1/1024 a step that compounds through beta2 (at 0.999 to half as much again).
// The random number is a hash of the element's own unrounded bits, its lane in the block and
// a salt (the step), nothing about where the block lives, so a block codes to the same bits
// on every rank, tier, stage and world size. A nonzero second moment never codes to zero
// (Adam would divide the first moment by eps alone): it rounds up to the smallest step.
// Magnitudes below 2^-100 (square roots below 2^-50) code as zero, so every decoded value and
// square is an exact fp32 (and bf16) number. Values must be finite (the optimizers skip a
// step whose gradients are not).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define STRATA_Q8_HD __host__ __device__ __forceinline__
#else
#define STRATA_Q8_HD inline
#endif

namespace strata::q8 {

inline constexpr int kBlockElems = 16;
inline constexpr int kBlockBytes = 17;

STRATA_Q8_HD std::uint32_t bits_of(float x) {
  std::uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}
STRATA_Q8_HD float from_bits(std::uint32_t b) {
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
}
// The correctly rounded square root on either side (nvcc's fast-math flags cannot touch it).
STRATA_Q8_HD float sqrt_rn(float x) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(x);
#else
  return std::sqrt(x);
#endif
}
// 2^e for e in [-126, 127], exactly.
STRATA_Q8_HD float pow2(int e) { return from_bits(static_cast<std::uint32_t>(e + 127) << 23); }

// A 32-bit mixing hash (lowbias32): every input bit moves about half the output bits.
STRATA_Q8_HD std::uint32_t mix(std::uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// The element's uniform number in [0, 1), a multiple of 2^-19: added to a step count below
// 32 it stays exact, so an exact count never rounds up.
STRATA_Q8_HD float dither(float x, int lane, bool second, std::uint32_t salt) {
  const std::uint32_t h = mix(bits_of(x) ^ (salt * 0x9E3779B9u) ^ (static_cast<std::uint32_t>(lane) * 0x85EBCA6Bu) ^
                              (second ? 0x5BD1E995u : 0u));
  return static_cast<float>(h >> 13) * (1.0f / 524288.0f);
}

// x >= 0 and below 256 rounded stochastically to `man` mantissa bits with normal exponents
// down to -6 (below that a fixed step of 2^(-6 - man)); returns the number of steps r, the
// value being r x 2^(k - man) with k = max(exponent of x, -6), and sets k. With `square`, the
// step up is taken with the probability that makes r^2 (not r) exact in expectation:
// (a^2 - r0^2) / ((r0 + 1)^2 - r0^2) for a = x in steps and r0 its floor. Each operation is
// one rounding with no product feeding a sum, so no compiler can fuse it differently.
STRATA_Q8_HD std::uint32_t round_steps(float x, int man, float u, bool square, int& k) {
  const int e = static_cast<int>((bits_of(x) >> 23) & 0xffu) - 127;
  k = e < -6 ? -6 : e;
  const float a = x * pow2(man - k);                      // exact: a power of two
  if (!square) return static_cast<std::uint32_t>(a + u);  // floor (a + u >= 0)
  const std::uint32_t r0 = static_cast<std::uint32_t>(a);
  const float r0f = static_cast<float>(r0);
  const float num = (a - r0f) * (a + r0f), den = r0f + r0f + 1.0f;
  return r0 + (u * den < num ? 1u : 0u);
}

// Code of r steps at exponent k for e4m3 magnitudes (man 3) and e4m4 (man 4): r < 2^man only
// at k = -6 (a subnormal, whose code is r), otherwise r in [2^man, 2^(man+1)]. The code is
// (k + 7) << man for the exponent plus r - 2^man for the mantissa, which is one sum: r =
// 2^(man+1) carries into the next exponent's first code, and a subnormal r lands on itself.
STRATA_Q8_HD std::uint8_t code_of(std::uint32_t r, int k, int man) {
  return static_cast<std::uint8_t>(static_cast<std::uint32_t>(k + 6) * (1u << man) + r);
}

STRATA_Q8_HD float magnitude_of(std::uint8_t code, int man) {
  const int e = code >> man;
  const int f = code & ((1 << man) - 1);
  return e == 0 ? static_cast<float>(f) * pow2(-6 - man) : static_cast<float>((1 << man) + f) * pow2(e - 7 - man);
}

// The block's scale byte for a largest magnitude `amax` (a square root for the second moment).
STRATA_Q8_HD std::uint8_t scale_for(float amax, bool second) {
  // below 2^-100 (2^-50 for square roots) or zero: a zero block
  if (!(amax >= (second ? 8.881784197001252e-16f : 7.888609052210118e-31f))) return 0;
  const std::uint32_t b = bits_of(amax);
  const int e = static_cast<int>((b >> 23) & 0xffu) - 127;
  // above the largest code below 256 (248 = 1.9375 x 128; 240 = 1.875 x 128): the next scale
  const bool above = (b & 0x7fffffu) > (second ? 0x780000u : 0x700000u);
  return static_cast<std::uint8_t>(e - 7 + 127 + (above ? 1 : 0));
}

// Codes x[0..15] into out[0..16]. second: x are second moments (>= 0), coded by square root.
STRATA_Q8_HD void encode_block(const float* x, std::uint8_t* out, bool second, std::uint32_t salt) {
  float mag[kBlockElems];
  float amax = 0.0f;
  for (int i = 0; i < kBlockElems; ++i) {
    mag[i] = second ? sqrt_rn(x[i]) : from_bits(bits_of(x[i]) & 0x7fffffffu);
    amax = mag[i] > amax ? mag[i] : amax;
  }
  const std::uint8_t s = scale_for(amax, second);
  out[0] = s;
  if (s == 0) {
    for (int i = 0; i < kBlockElems; ++i) out[1 + i] = 0;
    return;
  }
  const float inv = pow2(127 - static_cast<int>(s));
  const int man = second ? 4 : 3;
  for (int i = 0; i < kBlockElems; ++i) {
    const float t = mag[i] * inv;  // exact; at most 240 (248): rounds to at most that
    int k = 0;
    std::uint32_t r = round_steps(t, man, dither(t, i, second, salt), second, k);
    if (second && r == 0 && t > 0.0f) r = 1;  // never zero: see the header
    std::uint8_t c = code_of(r, k, man);
    if (!second && x[i] < 0.0f && c != 0) c |= 0x80u;  // e4m3 sign bit
    out[1 + i] = c;
  }
}

// Decodes in[0..16] into x[0..15] (second moments squared back).
STRATA_Q8_HD void decode_block(const std::uint8_t* in, float* x, bool second) {
  const std::uint8_t s = in[0];
  if (s == 0) {
    for (int i = 0; i < kBlockElems; ++i) x[i] = 0.0f;
    return;
  }
  const float scale = pow2(static_cast<int>(s) - 127);
  for (int i = 0; i < kBlockElems; ++i) {
    const std::uint8_t c = in[1 + i];
    if (second) {
      const float w = magnitude_of(c, 4) * scale;
      x[i] = w * w;
    } else {
      const float m = magnitude_of(c & 0x7fu, 3) * scale;
      x[i] = (c & 0x80u) ? -m : m;
    }
  }
}

}  // namespace strata::q8
