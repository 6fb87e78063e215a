// The tiled causal attention of one head (see flash_attention.h).
#include "models/gpt/flash_attention.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

#include "models/gpt/gemm.h"
#include "models/gpt/parallel.h"

namespace strata::model::ops {
namespace {

constexpr int kTile = kFlashTile;

std::size_t row(int t, int ld) { return static_cast<std::size_t>(t) * static_cast<std::size_t>(ld); }

// Tile scores S = scale Q[i0..] K[j0..]^T into s (kTile columns per row); on the diagonal tile
// the entries above it are not valid keys, which valid_keys() tells the callers.
void scores(float* s, const AttentionHead& x, int i0, int br, int j0, int bc) {
  gemm_serial(false, true, br, bc, x.hd, x.scale, x.q + row(i0, x.ldq), x.ldq, x.k + row(j0, x.ldkv), x.ldkv, 0.0f, s,
              kTile);
}

int valid_keys(int i0, int r, int j0, int bc) { return j0 == i0 ? std::min(bc, r + 1) : bc; }

// p[0..n) = exp(p - shift), zero from n to kTile; returns their sum (lane by lane, then across).
float exp_row(float* p, int n, float shift) {
  const float sum = sum_lanes(n, [&](const Lanes& l) {
    const FloatBatch e = xsimd::exp(l.load(p) - shift);
    l.store(p, e);
    return e;  // sum_lanes leaves the padded lanes out
  });
  std::fill(p + n, p + kTile, 0.0f);
  return sum;
}

struct Scratch {
  std::vector<float> s, dp, m, l, d;
};

Scratch& scratch(int T) {
  thread_local Scratch w;
  w.s.resize(static_cast<std::size_t>(kTile) * kTile);
  w.dp.resize(w.s.size());
  w.m.resize(kTile);
  w.l.resize(kTile);
  w.d.resize(static_cast<std::size_t>(T));
  return w;
}

}  // namespace

void flash_forward(const AttentionHead& x, float* y, int ldy, float* lse, float* y_copy) {
  Scratch& w = scratch(x.T);
  float *s = w.s.data(), *m = w.m.data(), *l = w.l.data();
  for (int i0 = 0; i0 < x.T; i0 += kTile) {
    const int br = std::min(kTile, x.T - i0);
    std::fill_n(m, br, -std::numeric_limits<float>::infinity());
    std::fill_n(l, br, 0.0f);
    for (int r = 0; r < br; ++r) std::fill_n(y + row(i0 + r, ldy), x.hd, 0.0f);
    for (int j0 = 0; j0 <= i0; j0 += kTile) {
      const int bc = std::min(kTile, x.T - j0);
      scores(s, x, i0, br, j0, bc);
      for (int r = 0; r < br; ++r) {
        float* p = s + row(r, kTile);
        const int n = valid_keys(i0, r, j0, bc);
        const float mx = std::max(m[r], *std::max_element(p, p + n));
        const float keep = std::exp(m[r] - mx);  // the earlier tiles' share, rescaled to the new maximum
        l[r] = l[r] * keep + exp_row(p, n, mx);
        m[r] = mx;
        float* yr = y + row(i0 + r, ldy);
        for (int e = 0; e < x.hd; ++e) yr[e] *= keep;
      }
      gemm_serial(false, false, br, x.hd, bc, 1.0f, s, kTile, x.v + row(j0, x.ldkv), x.ldkv, 1.0f, y + row(i0, ldy),
                  ldy);
    }
    for (int r = 0; r < br; ++r) {
      float* yr = y + row(i0 + r, ldy);
      const float inv = 1.0f / l[r];
      for (int e = 0; e < x.hd; ++e) yr[e] *= inv;
      std::copy(yr, yr + x.hd, y_copy + row(i0 + r, ldy));
      lse[i0 + r] = m[r] + std::log(l[r]);
    }
  }
}

void flash_backward(const AttentionHead& x, const float* dy, const float* y, int ldy, const float* lse, float* dq,
                    float* dk, float* dv, bool accumulate_kv) {
  Scratch& w = scratch(x.T);
  float *s = w.s.data(), *dp = w.dp.data(), *d = w.d.data();
  for (int t = 0; t < x.T; ++t) {  // D = rowsum(dY o Y): the softmax backward's subtracted term
    const float *g = dy + row(t, ldy), *o = y + row(t, ldy);
    float acc = 0.0f;
    for (int e = 0; e < x.hd; ++e) acc += g[e] * o[e];
    d[t] = acc;
    std::fill_n(dq + row(t, x.ldq), x.hd, 0.0f);
    if (!accumulate_kv) {
      std::fill_n(dk + row(t, x.ldkv), x.hd, 0.0f);
      std::fill_n(dv + row(t, x.ldkv), x.hd, 0.0f);
    }
  }
  for (int i0 = 0; i0 < x.T; i0 += kTile) {
    const int br = std::min(kTile, x.T - i0);
    for (int j0 = 0; j0 <= i0; j0 += kTile) {
      const int bc = std::min(kTile, x.T - j0);
      scores(s, x, i0, br, j0, bc);
      for (int r = 0; r < br; ++r) exp_row(s + row(r, kTile), valid_keys(i0, r, j0, bc), lse[i0 + r]);  // P
      // dV_j += P^T dY_i; dP = dY_i V_j^T
      gemm_serial(true, false, bc, x.hd, br, 1.0f, s, kTile, dy + row(i0, ldy), ldy, 1.0f, dv + row(j0, x.ldkv),
                  x.ldkv);
      gemm_serial(false, true, br, bc, x.hd, 1.0f, dy + row(i0, ldy), ldy, x.v + row(j0, x.ldkv), x.ldkv, 0.0f, dp,
                  kTile);
      for (int r = 0; r < br; ++r) {  // dS = P o (dP - D), zero where P is
        const float* p = s + row(r, kTile);
        float* g = dp + row(r, kTile);
        for (int c = 0; c < bc; ++c) g[c] = p[c] * (g[c] - d[i0 + r]);
      }
      // S = scale Q K^T: dQ_i += scale dS K_j; dK_j += scale dS^T Q_i
      gemm_serial(false, false, br, x.hd, bc, x.scale, dp, kTile, x.k + row(j0, x.ldkv), x.ldkv, 1.0f,
                  dq + row(i0, x.ldq), x.ldq);
      gemm_serial(true, false, bc, x.hd, br, x.scale, dp, kTile, x.q + row(i0, x.ldq), x.ldq, 1.0f,
                  dk + row(j0, x.ldkv), x.ldkv);
    }
  }
}

}  // namespace strata::model::ops
