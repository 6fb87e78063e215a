// Causal multi-head self-attention on the host (see ops.h), tiled in the flash manner: each
// (batch, head) pair is one task that walks query blocks of kTile rows against the key blocks
// at or before them (the blocks above the diagonal are never computed), keeping a running
// maximum and sum per row (the online softmax), so no T x T buffer exists and the memory kept
// for backward is each row's log-sum-exp and a copy of the output: linear in T. Backward
// recomputes each tile's probabilities from the log-sum-exp. The products are single-threaded
// fp32 SGEMMs (gemm_serial) on tiles, the exponentials xsimd batches; a task runs serially,
// so the bits do not depend on the thread count.
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "models/gpt/gemm.h"
#include "models/gpt/ops.h"
#include "models/gpt/parallel.h"

namespace strata::model::ops {
namespace {

constexpr int kTile = 64;  // query and key rows per tile

// One head of one sequence: q, k, v rows at a stride of 3C, outputs and their gradients at C.
struct Head {
  const float *q, *k, *v;
  int T, hs, ld;
};

Head head(const float* qkv, int b, int h, int T, int C, int NH) {
  const int hs = C / NH;
  const float* q = qkv + static_cast<std::size_t>(b) * T * 3 * C + static_cast<std::size_t>(h) * hs;
  return {q, q + C, q + 2 * C, T, hs, 3 * C};
}

std::size_t row(int t, int ld) { return static_cast<std::size_t>(t) * static_cast<std::size_t>(ld); }

// Tile scores S = scale Q[i0..] K[j0..]^T into s (kTile columns per row); on the diagonal tile
// the entries above it are not valid keys, which valid_keys() tells the callers.
void scores(float* s, const Head& x, int i0, int br, int j0, int bc, float scale) {
  gemm_serial(false, true, br, bc, x.hs, scale, x.q + row(i0, x.ld), x.ld, x.k + row(j0, x.ld), x.ld, 0.0f, s, kTile);
}

int valid_keys(int i0, int r, int j0, int bc) { return j0 == i0 ? std::min(bc, r + 1) : bc; }

// p[0..n) = exp(p - shift), zero from n to kTile; returns their sum (lane by lane, then across).
float exp_row(float* p, int n, float shift) {
  FloatBatch sum(0.0f);
  for (int c = 0; c < n; c += static_cast<int>(FloatBatch::size)) {
    const Lanes l{static_cast<std::size_t>(c), std::min(FloatBatch::size, static_cast<std::size_t>(n - c))};
    FloatBatch e = xsimd::exp(l.load(p) - shift);
    if (l.len < FloatBatch::size) {  // the padded lanes must not count
      alignas(64) float keep[FloatBatch::size] = {};
      std::fill_n(keep, l.len, 1.0f);
      e *= FloatBatch::load_aligned(keep);
    }
    l.store(p, e);
    sum += e;
  }
  std::fill(p + n, p + kTile, 0.0f);
  return xsimd::hadd(sum);
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

void forward_head(float* y, float* lse, float* y_copy, const Head& x, int C, float scale) {
  Scratch& w = scratch(x.T);
  float *s = w.s.data(), *m = w.m.data(), *l = w.l.data();
  for (int i0 = 0; i0 < x.T; i0 += kTile) {
    const int br = std::min(kTile, x.T - i0);
    std::fill_n(m, br, -std::numeric_limits<float>::infinity());
    std::fill_n(l, br, 0.0f);
    for (int r = 0; r < br; ++r) std::fill_n(y + row(i0 + r, C), x.hs, 0.0f);
    for (int j0 = 0; j0 <= i0; j0 += kTile) {
      const int bc = std::min(kTile, x.T - j0);
      scores(s, x, i0, br, j0, bc, scale);
      for (int r = 0; r < br; ++r) {
        float* p = s + row(r, kTile);
        const int n = valid_keys(i0, r, j0, bc);
        const float mx = std::max(m[r], *std::max_element(p, p + n));
        const float keep = std::exp(m[r] - mx);  // the earlier tiles' share, rescaled to the new maximum
        l[r] = l[r] * keep + exp_row(p, n, mx);
        m[r] = mx;
        float* yr = y + row(i0 + r, C);
        for (int e = 0; e < x.hs; ++e) yr[e] *= keep;
      }
      gemm_serial(false, false, br, x.hs, bc, 1.0f, s, kTile, x.v + row(j0, x.ld), x.ld, 1.0f, y + row(i0, C), C);
    }
    for (int r = 0; r < br; ++r) {
      float* yr = y + row(i0 + r, C);
      const float inv = 1.0f / l[r];
      for (int e = 0; e < x.hs; ++e) yr[e] *= inv;
      std::copy(yr, yr + x.hs, y_copy + row(i0 + r, C));
      lse[i0 + r] = m[r] + std::log(l[r]);
    }
  }
}

// dq, dk, dv: this head's gradient columns (stride 3C), overwritten.
void backward_head(float* dq, float* dk, float* dv, const float* dy, const float* lse, const float* y, const Head& x,
                   int C, float scale) {
  Scratch& w = scratch(x.T);
  float *s = w.s.data(), *dp = w.dp.data(), *d = w.d.data();
  for (int t = 0; t < x.T; ++t) {  // D = rowsum(dY o Y): the softmax backward's subtracted term
    const float *g = dy + row(t, C), *o = y + row(t, C);
    float acc = 0.0f;
    for (int e = 0; e < x.hs; ++e) acc += g[e] * o[e];
    d[t] = acc;
    for (float* out : {dq, dk, dv}) std::fill_n(out + row(t, x.ld), x.hs, 0.0f);
  }
  for (int i0 = 0; i0 < x.T; i0 += kTile) {
    const int br = std::min(kTile, x.T - i0);
    for (int j0 = 0; j0 <= i0; j0 += kTile) {
      const int bc = std::min(kTile, x.T - j0);
      scores(s, x, i0, br, j0, bc, scale);
      for (int r = 0; r < br; ++r) exp_row(s + row(r, kTile), valid_keys(i0, r, j0, bc), lse[i0 + r]);  // P
      // dV_j += P^T dY_i; dP = dY_i V_j^T
      gemm_serial(true, false, bc, x.hs, br, 1.0f, s, kTile, dy + row(i0, C), C, 1.0f, dv + row(j0, x.ld), x.ld);
      gemm_serial(false, true, br, bc, x.hs, 1.0f, dy + row(i0, C), C, x.v + row(j0, x.ld), x.ld, 0.0f, dp, kTile);
      for (int r = 0; r < br; ++r) {  // dS = P o (dP - D), zero where P is
        const float* p = s + row(r, kTile);
        float* g = dp + row(r, kTile);
        for (int c = 0; c < bc; ++c) g[c] = p[c] * (g[c] - d[i0 + r]);
      }
      // S = scale Q K^T: dQ_i += scale dS K_j; dK_j += scale dS^T Q_i
      gemm_serial(false, false, br, x.hs, bc, scale, dp, kTile, x.k + row(j0, x.ld), x.ld, 1.0f, dq + row(i0, x.ld),
                  x.ld);
      gemm_serial(true, false, bc, x.hs, br, scale, dp, kTile, x.q + row(i0, x.ld), x.ld, 1.0f, dk + row(j0, x.ld),
                  x.ld);
    }
  }
}

}  // namespace

float score_scale(int head_size) { return 1.0f / std::sqrt(static_cast<float>(head_size)); }

std::size_t attention_state_floats(int B, int T, int C, int NH) {
  return static_cast<std::size_t>(B) * static_cast<std::size_t>(T) *
         (static_cast<std::size_t>(NH) + static_cast<std::size_t>(C));
}

void attention_forward(float* out, float* state, const float* qkv, int B, int T, int C, int NH, float scale) {
  const int hs = C / NH;
  float* y_copy = state + static_cast<std::size_t>(B) * NH * T;
  tbb::parallel_for(0, B * NH, [&](int bh) {
    const int b = bh / NH, h = bh % NH;
    const std::size_t at = static_cast<std::size_t>(b) * T * C + static_cast<std::size_t>(h) * hs;
    forward_head(out + at, state + static_cast<std::size_t>(bh) * T, y_copy + at, head(qkv, b, h, T, C, NH), C, scale);
  });
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* state, int B, int T, int C,
                        int NH, float scale) {
  const int hs = C / NH;
  const float* y = state + static_cast<std::size_t>(B) * NH * T;
  tbb::parallel_for(0, B * NH, [&](int bh) {
    const int b = bh / NH, h = bh % NH;
    const std::size_t at = static_cast<std::size_t>(b) * T * C + static_cast<std::size_t>(h) * hs;
    float* dq = dqkv + static_cast<std::size_t>(b) * T * 3 * C + static_cast<std::size_t>(h) * hs;
    backward_head(dq, dq + C, dq + 2 * C, dout + at, state + static_cast<std::size_t>(bh) * T, y + at,
                  head(qkv, b, h, T, C, NH), C, scale);
  });
}

}  // namespace strata::model::ops
