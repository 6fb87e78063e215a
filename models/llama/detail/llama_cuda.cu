// The Llama family's GPU arithmetic (see llama_cuda.h). Elementwise products and sums are
// written with the _rn intrinsics where the host rounds each operation on its own, so the
// compiler does not fuse them into multiply-adds the host does not make; row sums are one
// warp per row, column sums kTileCols columns a block with kGroups row groups added in order.
#include <cuda_runtime.h>

#include "models/detail/cuda_launch.cuh"
#include "models/llama/detail/llama_cuda.h"
#include "runtime/core/error.h"
#include "runtime/device/cuda_check.h"

namespace strata::model::detail {
namespace {

// One warp per row.
__global__ void rmsnorm_forward_kernel(float* out, float* rstd, const float* inp, const float* w, int N, int C,
                                       float eps) {
  const int row = blockIdx.x * kWarps + static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  if (row >= N) return;
  const float* x = inp + static_cast<std::size_t>(row) * C;
  double ss = 0.0;
  for (int c = lane; c < C; c += 32) ss += static_cast<double>(x[c]) * static_cast<double>(x[c]);
  ss = warp_sum(ss);
  const float r = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(C) + static_cast<double>(eps)));
  float* y = out + static_cast<std::size_t>(row) * C;
  for (int c = lane; c < C; c += 32) y[c] = __fmul_rn(w[c], __fmul_rn(x[c], r));
  if (lane == 0) rstd[row] = r;
}

__global__ void rmsnorm_backward_input_kernel(float* dinp, const float* dout, const float* inp, const float* w,
                                              const float* rstd, int N, int C, bool accumulate) {
  const int row = blockIdx.x * kWarps + static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  if (row >= N) return;
  const std::size_t off = static_cast<std::size_t>(row) * C;
  const float *x = inp + off, *d = dout + off;
  const float r = rstd[row];
  double dot = 0.0;
  for (int c = lane; c < C; c += 32) dot += static_cast<double>(__fmul_rn(w[c], d[c])) * static_cast<double>(x[c]);
  dot = warp_sum(dot);
  const double rd = r;
  const float k = static_cast<float>(dot * rd * rd * rd / static_cast<double>(C));
  float* dx = dinp + off;
  for (int c = lane; c < C; c += 32) {
    const float g = __fsub_rn(__fmul_rn(r, __fmul_rn(w[c], d[c])), __fmul_rn(k, x[c]));
    dx[c] = accumulate ? __fadd_rn(dx[c], g) : g;
  }
}

__global__ void rmsnorm_backward_weight_kernel(float* dw, const float* dout, const float* inp, const float* rstd, int N,
                                               int C) {
  __shared__ float part[kGroups][kTileCols + 1];
  const int col = blockIdx.x * kTileCols + static_cast<int>(threadIdx.x), g = static_cast<int>(threadIdx.y);
  float a = 0.0f;
  if (col < C) {
    for (int n = g; n < N; n += kGroups) {
      const std::size_t i = static_cast<std::size_t>(n) * C + col;
      a = __fadd_rn(a, __fmul_rn(dout[i], __fmul_rn(inp[i], rstd[n])));
    }
  }
  part[g][threadIdx.x] = a;
  __syncthreads();
  if (g == 0 && col < C) {
    float s = 0.0f;
    for (int k = 0; k < kGroups; ++k) s = __fadd_rn(s, part[k][threadIdx.x]);
    dw[col] = __fadd_rn(dw[col], s);
  }
}

// One thread per (row, head, i < hd / 2): the pair (i, i + hd / 2) of that head.
__global__ void rope_kernel(float* x, const float* cos, const float* sin, std::size_t pairs, int T, int heads, int half,
                            float sign) {
  STRATA_GRID_STRIDE(p, pairs) {
    const std::size_t i = p % static_cast<std::size_t>(half), rh = p / static_cast<std::size_t>(half);
    const std::size_t n = rh / static_cast<std::size_t>(heads);
    const std::size_t t = n % static_cast<std::size_t>(T);
    float* a = x + rh * static_cast<std::size_t>(2 * half);
    const float c = cos[t * static_cast<std::size_t>(half) + i];
    const float s = __fmul_rn(sign, sin[t * static_cast<std::size_t>(half) + i]);
    const float ai = a[i], bi = a[i + static_cast<std::size_t>(half)];
    a[i] = __fsub_rn(__fmul_rn(ai, c), __fmul_rn(bi, s));
    a[i + static_cast<std::size_t>(half)] = __fadd_rn(__fmul_rn(bi, c), __fmul_rn(ai, s));
  }
}

__global__ void swiglu_forward_kernel(float* out, const float* gate, const float* up, std::size_t n) {
  STRATA_GRID_STRIDE(i, n) {
    const float g = gate[i];
    out[i] = __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), up[i]);
  }
}

__global__ void swiglu_backward_kernel(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                                       std::size_t n) {
  STRATA_GRID_STRIDE(i, n) {
    const float g = gate[i], s = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-g))), d = dout[i];
    dup[i] = __fmul_rn(d, __fmul_rn(g, s));
    const float local = __fmul_rn(s, __fadd_rn(1.0f, __fmul_rn(g, __fsub_rn(1.0f, s))));
    dgate[i] = __fmul_rn(__fmul_rn(d, up[i]), local);
  }
}

__global__ void embedding_forward_kernel(float* out, const std::int32_t* tokens, const float* table, std::size_t n,
                                         int C) {
  STRATA_GRID_STRIDE(i, n) {
    const std::size_t row = i / static_cast<std::size_t>(C), c = i % static_cast<std::size_t>(C);
    out[i] = table[static_cast<std::size_t>(tokens[row]) * C + c];
  }
}

// blockIdx.y walks the segments, the x dimension the channels; each element of a token's row
// sums that token's dout rows one at a time from zero, then adds the sum to the table's
// gradient: the host's order (llama/ops.cc), so the bits agree.
__global__ void embedding_backward_kernel(float* dtable, const float* dout, const std::int32_t* order,
                                          const std::int32_t* start, const std::int32_t* token, int segments, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  for (int s = blockIdx.y; s < segments; s += gridDim.y) {
    float sum = 0.0f;
    for (int i = start[s]; i < start[s + 1]; ++i)
      sum = __fadd_rn(sum, dout[static_cast<std::size_t>(order[i]) * C + c]);
    float* e = dtable + static_cast<std::size_t>(token[s]) * C + c;
    *e = __fadd_rn(*e, sum);
  }
}

}  // namespace

void cuda_rmsnorm_forward(void* stream, float* out, float* rstd, const float* inp, const float* w, int N, int C,
                          float eps) {
  if (N == 0) return;
  rmsnorm_forward_kernel<<<row_blocks(N), kThreads, 0, as_stream(stream)>>>(out, rstd, inp, w, N, C, eps);
  launched("llama rmsnorm forward");
}

void cuda_rmsnorm_backward_input(void* stream, float* dinp, const float* dout, const float* inp, const float* w,
                                 const float* rstd, int N, int C, bool accumulate) {
  if (N == 0) return;
  rmsnorm_backward_input_kernel<<<row_blocks(N), kThreads, 0, as_stream(stream)>>>(dinp, dout, inp, w, rstd, N, C,
                                                                                   accumulate);
  launched("llama rmsnorm backward (input)");
}

void cuda_rmsnorm_backward_weight(void* stream, float* dw, const float* dout, const float* inp, const float* rstd,
                                  int N, int C) {
  rmsnorm_backward_weight_kernel<<<(C + kTileCols - 1) / kTileCols, dim3(kTileCols, kGroups), 0, as_stream(stream)>>>(
      dw, dout, inp, rstd, N, C);
  launched("llama rmsnorm backward (weight)");
}

void cuda_rope(void* stream, float* x, const float* cos, const float* sin, int B, int T, int heads, int hd,
               float sign) {
  const int half = hd / 2;
  const std::size_t pairs = static_cast<std::size_t>(B) * T * heads * half;
  if (pairs == 0) return;
  rope_kernel<<<blocks_for(pairs, kThreads), kThreads, 0, as_stream(stream)>>>(x, cos, sin, pairs, T, heads, half,
                                                                               sign);
  launched("llama rope");
}

void cuda_swiglu_forward(void* stream, float* out, const float* gate, const float* up, std::size_t n) {
  if (n == 0) return;
  swiglu_forward_kernel<<<blocks_for(n, kThreads), kThreads, 0, as_stream(stream)>>>(out, gate, up, n);
  launched("llama swiglu forward");
}

void cuda_swiglu_backward(void* stream, float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                          std::size_t n) {
  if (n == 0) return;
  swiglu_backward_kernel<<<blocks_for(n, kThreads), kThreads, 0, as_stream(stream)>>>(dgate, dup, dout, gate, up, n);
  launched("llama swiglu backward");
}

void cuda_embedding_forward(void* stream, float* out, const std::int32_t* tokens, const float* table, int N, int C) {
  const std::size_t n = static_cast<std::size_t>(N) * C;
  if (n == 0) return;
  embedding_forward_kernel<<<blocks_for(n, kThreads), kThreads, 0, as_stream(stream)>>>(out, tokens, table, n, C);
  launched("llama embedding forward");
}

void cuda_embedding_backward(void* stream, float* dtable, const float* dout, const std::int32_t* order,
                             const std::int32_t* start, const std::int32_t* token, int segments, int C) {
  if (segments == 0) return;
  const dim3 grid(static_cast<unsigned>((C + 127) / 128), static_cast<unsigned>(segments < 65535 ? segments : 65535));
  embedding_backward_kernel<<<grid, 128, 0, as_stream(stream)>>>(dtable, dout, order, start, token, segments, C);
  launched("llama embedding backward");
}

}  // namespace strata::model::detail
