// Causal multi-head self-attention on the host (see ops.h): each (batch, head) pair is one
// task of single-threaded SGEMMs (gemm_serial), so the tasks are the parallelism. Scores for the whole T x T square are
// computed and the upper triangle masked: half the products are wasted, in exchange for plain GEMMs.
#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "models/gpt/gemm.h"
#include "models/gpt/ops.h"

namespace strata::model::ops {
float score_scale(int head_size) { return 1.0f / std::sqrt(static_cast<float>(head_size)); }

void causal_softmax_backward(float* ds, const float* p, int T) {
  for (int i = 0; i < T; ++i) {
    const float* pr = p + static_cast<std::size_t>(i) * T;
    float* dr = ds + static_cast<std::size_t>(i) * T;
    float dot = 0.0f;
    for (int j = 0; j <= i; ++j) dot += pr[j] * dr[j];
    for (int j = 0; j <= i; ++j) dr[j] = pr[j] * (dr[j] - dot);
    std::fill(dr + i + 1, dr + T, 0.0f);
  }
}

void causal_softmax(float* p, int T) {
  for (int i = 0; i < T; ++i) {
    float* row = p + static_cast<std::size_t>(i) * T;
    float mx = row[0];
    for (int j = 1; j <= i; ++j) mx = std::max(mx, row[j]);
    float sum = 0.0f;
    for (int j = 0; j <= i; ++j) {
      row[j] = std::exp(row[j] - mx);
      sum += row[j];
    }
    const float inv = 1.0f / sum;
    for (int j = 0; j <= i; ++j) row[j] *= inv;
    std::fill(row + i + 1, row + T, 0.0f);
  }
}

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH, float scale) {
  const int hs = C / NH;
  const std::size_t TT = static_cast<std::size_t>(T) * T;
  tbb::parallel_for(0, B * NH, [&](int bh) {
    const int b = bh / NH, h = bh % NH;
    const float* q = qkv + static_cast<std::size_t>(b) * T * 3 * C + static_cast<std::size_t>(h) * hs;
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* p = att + static_cast<std::size_t>(bh) * TT;
    gemm_serial(false, true, T, T, hs, scale, q, 3 * C, k, 3 * C, 0.0f, p, T);
    causal_softmax(p, T);
    float* y = out + static_cast<std::size_t>(b) * T * C + static_cast<std::size_t>(h) * hs;
    gemm_serial(false, false, T, hs, T, 1.0f, p, T, v, 3 * C, 0.0f, y, C);
  });
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int C, int NH,
                        float scale) {
  const int hs = C / NH;
  const std::size_t TT = static_cast<std::size_t>(T) * T;
  tbb::enumerable_thread_specific<std::vector<float>> scratch([TT] { return std::vector<float>(TT); });
  tbb::parallel_for(0, B * NH, [&](int bh) {
    const int b = bh / NH, h = bh % NH;
    const std::size_t base = static_cast<std::size_t>(b) * T * 3 * C + static_cast<std::size_t>(h) * hs;
    const float* q = qkv + base;
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* dq = dqkv + base;
    float* dk = dq + C;
    float* dv = dq + 2 * C;
    const float* p = att + static_cast<std::size_t>(bh) * TT;
    const float* dy = dout + static_cast<std::size_t>(b) * T * C + static_cast<std::size_t>(h) * hs;
    float* ds = scratch.local().data();
    // dP = dY V^T; dV = P^T dY
    gemm_serial(false, true, T, T, hs, 1.0f, dy, C, v, 3 * C, 0.0f, ds, T);
    gemm_serial(true, false, T, hs, T, 1.0f, p, T, dy, C, 0.0f, dv, 3 * C);
    causal_softmax_backward(ds, p, T);
    // S = scale Q K^T: dQ = scale dS K; dK = scale dS^T Q
    gemm_serial(false, false, T, hs, T, scale, ds, T, k, 3 * C, 0.0f, dq, 3 * C);
    gemm_serial(true, false, T, hs, T, scale, ds, T, q, 3 * C, 0.0f, dk, 3 * C);
  });
}

}  // namespace strata::model::ops
