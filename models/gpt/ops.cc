// Host implementations of the GPT's operations (see ops.h). Parallel loops split rows into
// fixed blocks; reductions across rows sum each block in row order, then the blocks in
// block order, so no result depends on how TBB schedules the blocks.
#include "models/gpt/ops.h"

#include "models/gpt/gemm.h"
#include "models/gpt/parallel.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <thread>
#include <vector>

namespace strata::model::ops {

void matmul_forward(float* out, const float* inp, const float* W, const float* b, int N, int IC, int OC, Products p,
                    const ProductScales& s) {
  float beta = 0.0f;
  if (b != nullptr) {
    for_rows(N, [&](int n) { std::copy(b, b + OC, out + static_cast<std::size_t>(n) * OC); });
    beta = 1.0f;
  }
  gemm(p, false, false, N, OC, IC, s.fwd, inp, IC, W, OC, beta, out, OC);
}

void matmul_backward(float* dinp, float* dW, float* db, const float* dout, const float* inp, const float* W, int N,
                     int IC, int OC, bool accumulate, Products p, const ProductScales& s) {
  // Both products read dout: with bf16 products it is rounded once (the same codes twice).
  const Bf16Shadow once(dinp != nullptr ? p : Products::fp32, dout, static_cast<std::size_t>(N) * OC);
  if (dinp != nullptr) matmul_backward_input(dinp, dout, W, N, IC, OC, accumulate, p, s);
  matmul_backward_weight(dW, db, dout, inp, N, IC, OC, p, s);
}

void matmul_backward_input(float* dinp, const float* dout, const float* W, int N, int IC, int OC, bool accumulate,
                           Products p, const ProductScales& s) {
  gemm(p, false, true, N, IC, OC, s.grad_in, dout, OC, W, OC, accumulate ? 1.0f : 0.0f, dinp, IC);
}

void matmul_backward_weight(float* dW, float* db, const float* dout, const float* inp, int N, int IC, int OC,
                            Products p, const ProductScales& s) {
  gemm(p, true, false, IC, OC, N, s.grad_w, inp, IC, dout, OC, 1.0f, dW, OC);
  if (db != nullptr) bias_backward(db, dout, N, OC);
}

void bias_backward(float* db, const float* dout, int N, int OC) {
  float* acc[1] = {db};
  reduce_rows(N, OC, 1, acc, [&](int n, float* part) {
    const float* d = dout + static_cast<std::size_t>(n) * OC;
    for_lanes(OC, [&](const Lanes& l) { l.store(part, l.load(part) + l.load(d)); });
  });
}

// LayerNorm's row sums and elementwise steps in xsimd batches (sum_lanes, for_lanes).
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b, int N,
                       int C) {
  for_rows(N, [&](int n) {
    const float* x = inp + static_cast<std::size_t>(n) * C;
    const float m = sum_lanes(C, [&](const Lanes& l) { return l.load(x); }) / static_cast<float>(C);
    const float v = sum_lanes(C,
                              [&](const Lanes& l) {
                                const FloatBatch d = l.load(x) - m;
                                return d * d;
                              }) /
                    static_cast<float>(C);
    const float s = 1.0f / std::sqrt(v + kLayerNormEps);
    float* y = out + static_cast<std::size_t>(n) * C;
    for_lanes(C, [&](const Lanes& l) { l.store(y, (l.load(x) - m) * s * l.load(w) + l.load(b)); });
    mean[n] = m;
    rstd[n] = s;
  });
}

void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                        const float* mean, const float* rstd, int N, int C) {
  layernorm_backward_input(dinp, dout, inp, w, mean, rstd, N, C);
  layernorm_backward_weight(dw, db, dout, inp, mean, rstd, N, C);
}

void layernorm_backward_input(float* dinp, const float* dout, const float* inp, const float* w, const float* mean,
                              const float* rstd, int N, int C) {
  for_rows(N, [&](int n) {
    const float* x = inp + static_cast<std::size_t>(n) * C;
    const float* d = dout + static_cast<std::size_t>(n) * C;
    float* dx = dinp + static_cast<std::size_t>(n) * C;
    const float m = mean[n], s = rstd[n];
    const float dnorm_mean =
        sum_lanes(C, [&](const Lanes& l) { return l.load(w) * l.load(d); }) / static_cast<float>(C);
    const float dnorm_norm_mean =
        sum_lanes(C, [&](const Lanes& l) { return l.load(w) * l.load(d) * ((l.load(x) - m) * s); }) /
        static_cast<float>(C);
    for_lanes(C, [&](const Lanes& l) {
      const FloatBatch norm = (l.load(x) - m) * s;
      l.store(dx, l.load(dx) + (l.load(w) * l.load(d) - dnorm_mean - norm * dnorm_norm_mean) * s);
    });
  });
}

void layernorm_backward_weight(float* dw, float* db, const float* dout, const float* inp, const float* mean,
                               const float* rstd, int N, int C) {
  float* acc[2] = {dw, db};
  reduce_rows(N, C, 2, acc, [&](int n, float* p) {
    const float* x = inp + static_cast<std::size_t>(n) * C;
    const float* d = dout + static_cast<std::size_t>(n) * C;
    const float m = mean[n], s = rstd[n];
    float* pdb = p + C;
    for_lanes(C, [&](const Lanes& l) {
      const FloatBatch g = l.load(d);
      l.store(p, l.load(p) + g * ((l.load(x) - m) * s));
      l.store(pdb, l.load(pdb) + g);
    });
  });
}

namespace {
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
}

// GELU's tanh form in xsimd batches (libm's scalar tanhf was 40% of a small GPT's step).
void gelu_forward(float* out, const float* inp, std::size_t n) {
  for_batches(n, [&](const Lanes& l) {
    const FloatBatch x = l.load(inp);
    l.store(out, 0.5f * x * (1.0f + xsimd::tanh(kGeluScale * (x + 0.044715f * x * x * x))));
  });
}

void gelu_backward(float* dinp, const float* inp, const float* dout, std::size_t n) {
  for_batches(n, [&](const Lanes& l) {
    const FloatBatch x = l.load(inp);
    const FloatBatch t = xsimd::tanh(kGeluScale * (x + 0.044715f * x * x * x));
    const FloatBatch sech2 = 1.0f - t * t;
    const FloatBatch local = 0.5f * (1.0f + t) + 0.5f * x * sech2 * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
    l.store(dinp, local * l.load(dout));
  });
}

void scale(float* x, float s, std::size_t n) {
  for_elems(n, [&](std::size_t i) { x[i] *= s; });
}

void weighted_add(float* acc, float acc_scale, const float* x, float x_scale, std::size_t n) {
  for_elems(n, [&](std::size_t i) { acc[i] = acc_scale * acc[i] + x_scale * x[i]; });
}

void residual_forward(float* out, const float* a, const float* b, std::size_t n) {
  for_elems(n, [&](std::size_t i) { out[i] = a[i] + b[i]; });
}

void accumulate(float* acc, const float* x, std::size_t n) {
  for_elems(n, [&](std::size_t i) { acc[i] += x[i]; });
}

void embedding_forward(float* out, const std::int32_t* tokens, const float* wte, const float* wpe, int B, int T,
                       int C) {
  for_rows(B * T, [&](int n) {
    const float* e = wte + static_cast<std::size_t>(tokens[n]) * C;
    const float* p = wpe + static_cast<std::size_t>(n % T) * C;
    float* y = out + static_cast<std::size_t>(n) * C;
    for (int c = 0; c < C; ++c) y[c] = e[c] + p[c];
  });
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens, int B, int T, int C) {
  // The rows of one token are summed from zero in row order and that sum is added to its
  // dwte row once: dwte's earlier contents (the tied head's part) plus the embedding's part,
  // the order in which a pipeline adds the two halves of the tied gradient. Rows are grouped
  // by token (stable sort); the channels, not the rows, are split between tasks.
  const int N = B * T;
  std::vector<int> order(static_cast<std::size_t>(N));
  for (int n = 0; n < N; ++n) order[static_cast<std::size_t>(n)] = n;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return tokens[a] < tokens[b]; });
  constexpr int kCols = 16;
  tbb::parallel_for(
      tbb::blocked_range<int>(0, C, kCols),
      [&](const tbb::blocked_range<int>& r) {
        float sum[kCols];
        for (std::size_t i = 0; i < order.size();) {
          const std::int32_t token = tokens[order[i]];
          std::fill(sum, sum + kCols, 0.0f);
          for (; i < order.size() && tokens[order[i]] == token; ++i) {
            const float* d = dout + static_cast<std::size_t>(order[i]) * C;
            for (int c = r.begin(); c < r.end(); ++c) sum[c - r.begin()] += d[c];
          }
          float* e = dwte + static_cast<std::size_t>(token) * C;
          for (int c = r.begin(); c < r.end(); ++c) e[c] += sum[c - r.begin()];
        }
        for (int n = 0; n < N; ++n) {
          const float* d = dout + static_cast<std::size_t>(n) * C;
          float* p = dwpe + static_cast<std::size_t>(n % T) * C;
          for (int c = r.begin(); c < r.end(); ++c) p[c] += d[c];
        }
      },
      tbb::simple_partitioner());
}

double cross_entropy(float* logits, float* losses, const std::int32_t* targets, int N, int V, float grad_scale) {
  for_rows(N, [&](int n) {
    float* z = logits + static_cast<std::size_t>(n) * V;
    float mx = z[0];
    for (int v = 1; v < V; ++v) mx = std::max(mx, z[v]);
    const int t = targets[n];
    const double zt = static_cast<double>(z[t]) - mx;
    double sum = 0.0;
    for (int v = 0; v < V; ++v) {
      z[v] = std::exp(z[v] - mx);
      sum += z[v];
    }
    const auto inv = static_cast<float>(1.0 / sum);
    losses[n] = static_cast<float>(std::log(sum) - zt);
    for (int v = 0; v < V; ++v) z[v] = z[v] * inv * grad_scale;
    z[t] -= grad_scale;
  });
  double total = 0.0;
  for (int n = 0; n < N; ++n) total += losses[n];
  return total;
}

}  // namespace strata::model::ops

namespace strata::model::ops {

void lm_head_forward(float* logits, const float* inp, const float* wte, int N, int C, int V, Products p,
                     const ProductScales& s) {
  gemm(p, false, true, N, V, C, s.fwd, inp, C, wte, C, 0.0f, logits, V);
}

void lm_head_backward(float* dinp, float* dwte, const float* dlogits, const float* inp, const float* wte, int N, int C,
                      int V, Products p, const ProductScales& s) {
  const Bf16Shadow once(p, dlogits, static_cast<std::size_t>(N) * V);  // both products read dlogits: rounded once
  gemm(p, false, false, N, C, V, s.grad_in, dlogits, V, wte, C, 0.0f, dinp, C);
  gemm(p, true, false, V, C, N, s.grad_w, dlogits, V, inp, C, 1.0f, dwte, C);
}

}  // namespace strata::model::ops
