// Host implementations of the Llama family's operations (see ops.h); attention is in
// attention.cc.
#include "models/llama/ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "models/gpt/ops.h"
#include "models/gpt/parallel.h"

namespace strata::model::llama {

using ops::for_batches;
using ops::for_rows;
using ops::reduce_rows;

void linear_forward(float* out, const float* inp, const float* W, const float* b, int N, int IC, int OC, Products p) {
  float beta = 0.0f;
  if (b != nullptr) {
    for_rows(N, [&](int n) { std::copy(b, b + OC, out + static_cast<std::size_t>(n) * OC); });
    beta = 1.0f;
  }
  ops::gemm(p, false, true, N, OC, IC, 1.0f, inp, IC, W, IC, beta, out, OC);
}

void linear_backward_input(float* dinp, const float* dout, const float* W, int N, int IC, int OC, bool accumulate,
                           Products p) {
  ops::gemm(p, false, false, N, IC, OC, 1.0f, dout, OC, W, IC, accumulate ? 1.0f : 0.0f, dinp, IC);
}

void linear_backward_weight(float* dW, float* db, const float* dout, const float* inp, int N, int IC, int OC,
                            Products p) {
  ops::gemm(p, true, false, OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f, dW, IC);
  if (db != nullptr) ops::bias_backward(db, dout, N, OC);
}

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N, int C, float eps) {
  for_rows(N, [&](int n) {
    const float* x = inp + static_cast<std::size_t>(n) * C;
    float* y = out + static_cast<std::size_t>(n) * C;
    double ss = 0.0;
    for (int c = 0; c < C; ++c) ss += static_cast<double>(x[c]) * x[c];
    const float r = static_cast<float>(1.0 / std::sqrt(ss / C + eps));
    rstd[n] = r;
    for (int c = 0; c < C; ++c) y[c] = w[c] * (x[c] * r);
  });
}

// y = w * x * r with r = (mean(x^2) + eps)^(-1/2):
// dx = r (w dy) - x r^3 / C sum_k (w dy x)_k; dw += dy x r.
void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w, const float* rstd,
                      int N, int C, bool accumulate) {
  rmsnorm_backward_input(dinp, dout, inp, w, rstd, N, C, accumulate);
  rmsnorm_backward_weight(dw, dout, inp, rstd, N, C);
}

void rmsnorm_backward_input(float* dinp, const float* dout, const float* inp, const float* w, const float* rstd, int N,
                            int C, bool accumulate) {
  for_rows(N, [&](int n) {
    const float* x = inp + static_cast<std::size_t>(n) * C;
    const float* d = dout + static_cast<std::size_t>(n) * C;
    float* dx = dinp + static_cast<std::size_t>(n) * C;
    const float r = rstd[n];
    double dot = 0.0;
    for (int c = 0; c < C; ++c) dot += static_cast<double>(w[c] * d[c]) * x[c];
    const float k = static_cast<float>(dot * r * r * r / C);
    for (int c = 0; c < C; ++c) {
      const float g = r * (w[c] * d[c]) - k * x[c];
      dx[c] = accumulate ? dx[c] + g : g;
    }
  });
}

void rmsnorm_backward_weight(float* dw, const float* dout, const float* inp, const float* rstd, int N, int C) {
  float* acc[1] = {dw};
  reduce_rows(N, C, 1, acc, [&](int n, float* p) {
    const float* x = inp + static_cast<std::size_t>(n) * C;
    const float* d = dout + static_cast<std::size_t>(n) * C;
    const float r = rstd[n];
    for (int c = 0; c < C; ++c) p[c] += d[c] * (x[c] * r);
  });
}

void rope_tables(float* cos, float* sin, const std::vector<double>& inv_freq, int T) {
  const std::size_t half = inv_freq.size();
  for (int t = 0; t < T; ++t) {
    for (std::size_t i = 0; i < half; ++i) {
      const double a = static_cast<double>(t) * inv_freq[i];
      cos[static_cast<std::size_t>(t) * half + i] = static_cast<float>(std::cos(a));
      sin[static_cast<std::size_t>(t) * half + i] = static_cast<float>(std::sin(a));
    }
  }
}

namespace {
// sign +1: the rotation; -1: its transpose.
void rotate(float* x, const float* cos, const float* sin, int B, int T, int heads, int hd, float sign) {
  const int half = hd / 2;
  for_rows(B * T, [&](int n) {
    const int t = n % T;
    const float* c = cos + static_cast<std::size_t>(t) * half;
    const float* s = sin + static_cast<std::size_t>(t) * half;
    for (int h = 0; h < heads; ++h) {
      float* a = x + (static_cast<std::size_t>(n) * heads + h) * hd;
      float* b = a + half;
      for (int i = 0; i < half; ++i) {
        const float ai = a[i], bi = b[i], si = sign * s[i];
        a[i] = ai * c[i] - bi * si;
        b[i] = bi * c[i] + ai * si;
      }
    }
  });
}
}  // namespace

void rope_forward(float* x, const float* cos, const float* sin, int B, int T, int heads, int hd) {
  rotate(x, cos, sin, B, T, heads, hd, 1.0f);
}

void rope_backward(float* dx, const float* cos, const float* sin, int B, int T, int heads, int hd) {
  rotate(dx, cos, sin, B, T, heads, hd, -1.0f);
}

// SiLU in xsimd batches (xsimd's exp instead of libm's scalar expf).
void swiglu_forward(float* out, const float* gate, const float* up, std::size_t n) {
  for_batches(n, [&](const ops::Lanes& l) {
    const ops::FloatBatch g = l.load(gate);
    l.store(out, g / (1.0f + xsimd::exp(-g)) * l.load(up));
  });
}

void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, std::size_t n) {
  for_batches(n, [&](const ops::Lanes& l) {
    const ops::FloatBatch g = l.load(gate), s = 1.0f / (1.0f + xsimd::exp(-g)), d = l.load(dout);
    l.store(dup, d * (g * s));
    l.store(dgate, d * l.load(up) * (s * (1.0f + g * (1.0f - s))));
  });
}

void embedding_forward(float* out, const std::int32_t* tokens, const float* table, int N, int C) {
  for_rows(N, [&](int n) {
    const float* row = table + static_cast<std::size_t>(tokens[n]) * C;
    std::copy(row, row + C, out + static_cast<std::size_t>(n) * C);
  });
}

// The rows of one token are summed from zero in row order and that sum is added to its
// dtable row once: dtable's earlier contents (a tied head's part) plus the embedding's part,
// the order in which a pipeline's tie adds the two halves (pipeline/tie.h), so a tied model
// trains to the same bits pipelined or not (models/llama/pipeline_layers.h). Rows are
// grouped by token (stable sort); the columns, not the rows, are split between tasks.
void embedding_backward(float* dtable, const float* dout, const std::int32_t* tokens, int N, int C) {
  std::vector<int> order(static_cast<std::size_t>(N));
  for (int n = 0; n < N; ++n) order[static_cast<std::size_t>(n)] = n;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return tokens[a] < tokens[b]; });
  constexpr int kCols = 64;
  tbb::parallel_for(0, (C + kCols - 1) / kCols, [&](int cb) {
    const int c0 = cb * kCols, c1 = std::min(C, c0 + kCols);
    float sum[kCols];
    for (std::size_t i = 0; i < order.size();) {
      const std::int32_t token = tokens[order[i]];
      std::fill(sum, sum + kCols, 0.0f);
      for (; i < order.size() && tokens[order[i]] == token; ++i) {
        const float* src = dout + static_cast<std::size_t>(order[i]) * C;
        for (int c = c0; c < c1; ++c) sum[c - c0] += src[c];
      }
      float* dst = dtable + static_cast<std::size_t>(token) * C;
      for (int c = c0; c < c1; ++c) dst[c] += sum[c - c0];
    }
  });
}

}  // namespace strata::model::llama
