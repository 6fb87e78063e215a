// Causal grouped-query attention on the host (see ops.h): forward runs each (batch, query
// head) pair as one task of single-threaded SGEMMs over the full T x T scores (the upper
// triangle masked); backward runs each (batch, kv head) pair as one task that goes through
// its query heads in order, so the kv gradients they share are summed in a fixed order.
#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "models/gpt/gemm.h"
#include "models/gpt/ops.h"
#include "models/llama/ops.h"

namespace strata::model::llama {
namespace {

// In place over scores p [T, T] (one task's, single-threaded): each row i's softmax over
// columns 0..i in fp32 (max subtracted first), zero above the diagonal.
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

// In place over ds [T, T]: dP (the probabilities' gradient) on entry, the scores' gradient
// P * (dP - rowsum(P * dP)) on return, zero above the diagonal.
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

}  // namespace

void attention_forward(float* out, float* att, const float* q, const float* k, const float* v, int B, int T, int NH,
                       int NKV, int hd) {
  const int group = NH / NKV, lq = NH * hd, lk = NKV * hd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const std::size_t TT = static_cast<std::size_t>(T) * T;
  tbb::parallel_for(0, B * NH, [&](int bh) {
    const int b = bh / NH, h = bh % NH, g = h / group;
    const std::size_t row0 = static_cast<std::size_t>(b) * T;
    const float* qh = q + row0 * lq + static_cast<std::size_t>(h) * hd;
    const float* kh = k + row0 * lk + static_cast<std::size_t>(g) * hd;
    const float* vh = v + row0 * lk + static_cast<std::size_t>(g) * hd;
    float* p = att + static_cast<std::size_t>(bh) * TT;
    ops::gemm_serial(false, true, T, T, hd, scale, qh, lq, kh, lk, 0.0f, p, T);
    causal_softmax(p, T);
    ops::gemm_serial(false, false, T, hd, T, 1.0f, p, T, vh, lk, 0.0f,
                     out + row0 * lq + static_cast<std::size_t>(h) * hd, lq);
  });
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                        const float* v, const float* att, int B, int T, int NH, int NKV, int hd) {
  const int group = NH / NKV, lq = NH * hd, lk = NKV * hd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const std::size_t TT = static_cast<std::size_t>(T) * T;
  tbb::enumerable_thread_specific<std::vector<float>> scratch([TT] { return std::vector<float>(TT); });
  tbb::parallel_for(0, B * NKV, [&](int bg) {
    const int b = bg / NKV, g = bg % NKV;
    const std::size_t row0 = static_cast<std::size_t>(b) * T;
    const std::size_t ko = row0 * lk + static_cast<std::size_t>(g) * hd;
    float* ds = scratch.local().data();
    for (int j = 0; j < group; ++j) {
      const int h = g * group + j;
      const std::size_t qo = row0 * lq + static_cast<std::size_t>(h) * hd;
      const float* p = att + (static_cast<std::size_t>(b) * NH + h) * TT;
      const float beta = j == 0 ? 0.0f : 1.0f;
      // dP = dY V^T; dV (+)= P^T dY
      ops::gemm_serial(false, true, T, T, hd, 1.0f, dout + qo, lq, v + ko, lk, 0.0f, ds, T);
      ops::gemm_serial(true, false, T, hd, T, 1.0f, p, T, dout + qo, lq, beta, dv + ko, lk);
      causal_softmax_backward(ds, p, T);
      // S = scale Q K^T: dQ = scale dS K; dK (+)= scale dS^T Q
      ops::gemm_serial(false, false, T, hd, T, scale, ds, T, k + ko, lk, 0.0f, dq + qo, lq);
      ops::gemm_serial(true, false, T, hd, T, scale, ds, T, q + qo, lq, beta, dk + ko, lk);
    }
  });
}

}  // namespace strata::model::llama
