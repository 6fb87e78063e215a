// The GPT's GPU arithmetic (see gpt_cuda.h). cuBLAS is column-major: a row-major [r, c]
// buffer is the column-major [c, r] matrix, so row-major C = op(A) op(B) is computed as
// C^T = op(B)^T op(A)^T. Row kernels give each row one warp (LayerNorm, softmax) or one
// block (cross-entropy, whose rows are vocabulary-long); column sums split the rows between a
// fixed set of threads per column and add their parts in a fixed order, so every result is
// the same on every run.
#include <cuda_runtime.h>

#include <cfloat>

#include "models/detail/cublas_api.h"
#include "models/detail/cuda_launch.cuh"
#include "models/gpt/detail/gpt_cuda.h"
#include "models/gpt/ops.h"
#include "runtime/core/error.h"
#include "runtime/device/cuda_check.h"

namespace strata::model::detail {
namespace {

void blas_check(cublasStatus_t s, const char* what) {
  STRATA_CHECK(s == CUBLAS_STATUS_SUCCESS, Errc::cuda, "cuBLAS ", what, " failed: ", cublas().status_string(s));
}

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)

__global__ void fill_rows_kernel(float* out, const float* b, std::size_t n, int C) {
  STRATA_GRID_STRIDE(i, n) out[i] = b[i % static_cast<std::size_t>(C)];
}

__global__ void column_sums_kernel(float* acc, const float* x, int N, int C) {
  __shared__ float part[kGroups][kTileCols + 1];
  const int col = blockIdx.x * kTileCols + static_cast<int>(threadIdx.x), g = static_cast<int>(threadIdx.y);
  float s = 0.0f;
  if (col < C)
    for (int n = g; n < N; n += kGroups) s += x[static_cast<std::size_t>(n) * C + col];
  part[g][threadIdx.x] = s;
  __syncthreads();
  if (g == 0 && col < C) {
    float t = 0.0f;
    for (int k = 0; k < kGroups; ++k) t += part[k][threadIdx.x];
    acc[col] += t;
  }
}

// One warp per row.
__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, const float* inp, const float* w,
                                         const float* b, int N, int C) {
  const int row = blockIdx.x * kWarps + static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  if (row >= N) return;
  const float* x = inp + static_cast<std::size_t>(row) * C;
  float s = 0.0f;
  for (int c = lane; c < C; c += 32) s += x[c];
  const float m = warp_sum(s) / static_cast<float>(C);
  float v = 0.0f;
  for (int c = lane; c < C; c += 32) v += (x[c] - m) * (x[c] - m);
  const float r = 1.0f / sqrtf(warp_sum(v) / static_cast<float>(C) + ops::kLayerNormEps);
  float* y = out + static_cast<std::size_t>(row) * C;
  for (int c = lane; c < C; c += 32) y[c] = (x[c] - m) * r * w[c] + b[c];
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

__global__ void layernorm_backward_input_kernel(float* dinp, const float* dout, const float* inp, const float* w,
                                                const float* mean, const float* rstd, int N, int C) {
  const int row = blockIdx.x * kWarps + static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  if (row >= N) return;
  const std::size_t off = static_cast<std::size_t>(row) * C;
  const float *x = inp + off, *d = dout + off;
  const float m = mean[row], s = rstd[row];
  float a = 0.0f, an = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const float dnorm = w[c] * d[c];
    a += dnorm;
    an += dnorm * (x[c] - m) * s;
  }
  const float dnorm_mean = warp_sum(a) / static_cast<float>(C);
  const float dnorm_norm_mean = warp_sum(an) / static_cast<float>(C);
  float* dx = dinp + off;
  for (int c = lane; c < C; c += 32) {
    const float norm = (x[c] - m) * s;
    dx[c] += (w[c] * d[c] - dnorm_mean - norm * dnorm_norm_mean) * s;
  }
}

__global__ void layernorm_backward_weight_kernel(float* dw, float* db, const float* dout, const float* inp,
                                                 const float* mean, const float* rstd, int N, int C) {
  __shared__ float pw[kGroups][kTileCols + 1], pb[kGroups][kTileCols + 1];
  const int col = blockIdx.x * kTileCols + static_cast<int>(threadIdx.x), g = static_cast<int>(threadIdx.y);
  float a = 0.0f, b = 0.0f;
  if (col < C) {
    for (int n = g; n < N; n += kGroups) {
      const std::size_t i = static_cast<std::size_t>(n) * C + col;
      a += dout[i] * (inp[i] - mean[n]) * rstd[n];
      b += dout[i];
    }
  }
  pw[g][threadIdx.x] = a;
  pb[g][threadIdx.x] = b;
  __syncthreads();
  if (g == 0 && col < C) {
    float sw = 0.0f, sb = 0.0f;
    for (int k = 0; k < kGroups; ++k) {
      sw += pw[k][threadIdx.x];
      sb += pb[k][threadIdx.x];
    }
    dw[col] += sw;
    db[col] += sb;
  }
}

__global__ void gelu_forward_kernel(float* out, const float* inp, std::size_t n) {
  STRATA_GRID_STRIDE(i, n) {
    const float x = inp[i];
    out[i] = 0.5f * x * (1.0f + tanhf(kGeluScale * (x + 0.044715f * x * x * x)));
  }
}

__global__ void gelu_backward_kernel(float* dinp, const float* inp, const float* dout, std::size_t n) {
  STRATA_GRID_STRIDE(i, n) {
    const float x = inp[i];
    const float t = tanhf(kGeluScale * (x + 0.044715f * x * x * x));
    const float local = 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] = local * dout[i];
  }
}

__global__ void causal_softmax_kernel(float* att, int rows, int T) {
  const int row = blockIdx.x * kWarps + static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  if (row >= rows) return;
  const int last = row % T;
  float* p = att + static_cast<std::size_t>(row) * T;
  float mx = -FLT_MAX;
  for (int j = lane; j <= last; j += 32) mx = fmaxf(mx, p[j]);
  mx = warp_max(mx);
  float s = 0.0f;
  for (int j = lane; j <= last; j += 32) {
    const float e = expf(p[j] - mx);
    p[j] = e;
    s += e;
  }
  const float inv = 1.0f / warp_sum(s);
  for (int j = lane; j <= last; j += 32) p[j] *= inv;
  for (int j = last + 1 + lane; j < T; j += 32) p[j] = 0.0f;
}

__global__ void causal_softmax_backward_kernel(float* ds, const float* att, int rows, int T) {
  const int row = blockIdx.x * kWarps + static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  if (row >= rows) return;
  const int last = row % T;
  const float* p = att + static_cast<std::size_t>(row) * T;
  float* d = ds + static_cast<std::size_t>(row) * T;
  float dot = 0.0f;
  for (int j = lane; j <= last; j += 32) dot += p[j] * d[j];
  dot = warp_sum(dot);
  for (int j = lane; j <= last; j += 32) d[j] = p[j] * (d[j] - dot);
  for (int j = last + 1 + lane; j < T; j += 32) d[j] = 0.0f;
}

__global__ void embedding_forward_kernel(float* out, const std::int32_t* tokens, const float* wte, const float* wpe,
                                         std::size_t n, int T, int C) {
  STRATA_GRID_STRIDE(i, n) {
    const std::size_t row = i / static_cast<std::size_t>(C), c = i % static_cast<std::size_t>(C);
    out[i] = __fadd_rn(wte[static_cast<std::size_t>(tokens[row]) * C + c], wpe[(row % T) * C + c]);
  }
}

// blockIdx.y walks the segments, the x dimension the channels.
__global__ void embedding_wte_backward_kernel(float* dwte, const float* dout, const std::int32_t* order,
                                              const std::int32_t* start, const std::int32_t* token, int segments,
                                              int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  for (int s = blockIdx.y; s < segments; s += gridDim.y) {
    float sum = 0.0f;
    for (int i = start[s]; i < start[s + 1]; ++i)
      sum = __fadd_rn(sum, dout[static_cast<std::size_t>(order[i]) * C + c]);
    float* e = dwte + static_cast<std::size_t>(token[s]) * C + c;
    *e = __fadd_rn(*e, sum);
  }
}

__global__ void embedding_wpe_backward_kernel(float* dwpe, const float* dout, int B, int T, int C) {
  const std::size_t n = static_cast<std::size_t>(T) * C;
  STRATA_GRID_STRIDE(i, n) {
    float acc = dwpe[i];
    for (int b = 0; b < B; ++b) acc = __fadd_rn(acc, dout[static_cast<std::size_t>(b) * n + i]);
    dwpe[i] = acc;
  }
}

// One block per row: the row's max, the sum of exponentials in double, the loss, then the
// gradient (softmax - onehot) * grad_scale in place.
__global__ void cross_entropy_kernel(float* logits, float* losses, const std::int32_t* targets, int V,
                                     float grad_scale) {
  __shared__ float fmax_part[kWarps];
  __shared__ double sum_part[kWarps];
  __shared__ float target_logit;
  const int row = blockIdx.x, lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  float* z = logits + static_cast<std::size_t>(row) * V;
  const int t = targets[row];
  if (threadIdx.x == 0) target_logit = z[t];
  float mx = -FLT_MAX;
  for (int v = static_cast<int>(threadIdx.x); v < V; v += blockDim.x) mx = fmaxf(mx, z[v]);
  mx = warp_max(mx);
  if (lane == 0) fmax_part[warp] = mx;
  __syncthreads();
  mx = fmax_part[0];
  for (int w = 1; w < kWarps; ++w) mx = fmaxf(mx, fmax_part[w]);
  double s = 0.0;
  for (int v = static_cast<int>(threadIdx.x); v < V; v += blockDim.x) s += static_cast<double>(expf(z[v] - mx));
  s = warp_sum(s);
  if (lane == 0) sum_part[warp] = s;
  __syncthreads();
  double total = 0.0;
  for (int w = 0; w < kWarps; ++w) total += sum_part[w];
  const float inv = static_cast<float>(1.0 / total);
  if (threadIdx.x == 0)
    losses[row] = static_cast<float>(log(total) - (static_cast<double>(target_logit) - static_cast<double>(mx)));
  for (int v = static_cast<int>(threadIdx.x); v < V; v += blockDim.x) z[v] = expf(z[v] - mx) * inv * grad_scale;
  __syncthreads();
  if (threadIdx.x == 0) z[t] -= grad_scale;
}

__global__ void axpby_kernel(float* acc, float a, const float* x, float b, std::size_t n) {
  STRATA_GRID_STRIDE(i, n) {
    acc[i] = x == nullptr ? __fmul_rn(a, acc[i]) : __fadd_rn(__fmul_rn(a, acc[i]), __fmul_rn(b, x[i]));
  }
}

cublasComputeType_t compute_type(ops::Products p) {
  switch (p) {
    case ops::Products::bf16:
      return CUBLAS_COMPUTE_32F_FAST_16BF;
    case ops::Products::fp16:
      return CUBLAS_COMPUTE_32F_FAST_16F;
    case ops::Products::fp32:
      break;
  }
  return CUBLAS_COMPUTE_32F;
}

cublasOperation_t op(bool t) { return t ? CUBLAS_OP_T : CUBLAS_OP_N; }

}  // namespace

void cuda_gemm(void* blas, ops::Products p, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
               const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  blas_check(
      cublas().gemm_ex(static_cast<cublasHandle_t>(blas), op(trans_b), op(trans_a), N, M, K, &alpha, B, CUDA_R_32F, ldb,
                       A, CUDA_R_32F, lda, &beta, C, CUDA_R_32F, ldc, compute_type(p), CUBLAS_GEMM_DEFAULT),
      "gemm");
}

void cuda_gemm_batched(void* blas, ops::Products p, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                       const float* A, int lda, long long sA, const float* B, int ldb, long long sB, float beta,
                       float* C, int ldc, long long sC, int batch) {
  blas_check(cublas().gemm_strided_batched_ex(static_cast<cublasHandle_t>(blas), op(trans_b), op(trans_a), N, M, K,
                                              &alpha, B, CUDA_R_32F, ldb, sB, A, CUDA_R_32F, lda, sA, &beta, C,
                                              CUDA_R_32F, ldc, sC, batch, compute_type(p), CUBLAS_GEMM_DEFAULT),
             "batched gemm");
}

void cuda_fill_rows(void* stream, float* out, const float* b, int N, int C) {
  const std::size_t n = static_cast<std::size_t>(N) * C;
  fill_rows_kernel<<<blocks_for(n, kThreads), kThreads, 0, as_stream(stream)>>>(out, b, n, C);
  launched("gpt bias rows");
}

void cuda_column_sums(void* stream, float* acc, const float* x, int N, int C) {
  column_sums_kernel<<<(C + kTileCols - 1) / kTileCols, dim3(kTileCols, kGroups), 0, as_stream(stream)>>>(acc, x, N, C);
  launched("gpt column sums");
}

void cuda_layernorm_forward(void* stream, float* out, float* mean, float* rstd, const float* inp, const float* w,
                            const float* b, int N, int C) {
  layernorm_forward_kernel<<<row_blocks(N), kThreads, 0, as_stream(stream)>>>(out, mean, rstd, inp, w, b, N, C);
  launched("gpt layernorm forward");
}

void cuda_layernorm_backward_input(void* stream, float* dinp, const float* dout, const float* inp, const float* w,
                                   const float* mean, const float* rstd, int N, int C) {
  layernorm_backward_input_kernel<<<row_blocks(N), kThreads, 0, as_stream(stream)>>>(dinp, dout, inp, w, mean, rstd, N,
                                                                                     C);
  launched("gpt layernorm backward (input)");
}

void cuda_layernorm_backward_weight(void* stream, float* dw, float* db, const float* dout, const float* inp,
                                    const float* mean, const float* rstd, int N, int C) {
  layernorm_backward_weight_kernel<<<(C + kTileCols - 1) / kTileCols, dim3(kTileCols, kGroups), 0, as_stream(stream)>>>(
      dw, db, dout, inp, mean, rstd, N, C);
  launched("gpt layernorm backward (weight)");
}

void cuda_gelu_forward(void* stream, float* out, const float* inp, std::size_t n) {
  gelu_forward_kernel<<<blocks_for(n, kThreads), kThreads, 0, as_stream(stream)>>>(out, inp, n);
  launched("gpt gelu forward");
}

void cuda_gelu_backward(void* stream, float* dinp, const float* inp, const float* dout, std::size_t n) {
  gelu_backward_kernel<<<blocks_for(n, kThreads), kThreads, 0, as_stream(stream)>>>(dinp, inp, dout, n);
  launched("gpt gelu backward");
}

void cuda_causal_softmax(void* stream, float* att, int rows, int T) {
  causal_softmax_kernel<<<row_blocks(rows), kThreads, 0, as_stream(stream)>>>(att, rows, T);
  launched("gpt causal softmax");
}

void cuda_causal_softmax_backward(void* stream, float* ds, const float* p, int rows, int T) {
  causal_softmax_backward_kernel<<<row_blocks(rows), kThreads, 0, as_stream(stream)>>>(ds, p, rows, T);
  launched("gpt causal softmax backward");
}

void cuda_embedding_forward(void* stream, float* out, const std::int32_t* tokens, const float* wte, const float* wpe,
                            int N, int T, int C) {
  const std::size_t n = static_cast<std::size_t>(N) * C;
  embedding_forward_kernel<<<blocks_for(n, kThreads), kThreads, 0, as_stream(stream)>>>(out, tokens, wte, wpe, n, T, C);
  launched("gpt embedding forward");
}

void cuda_embedding_backward(void* stream, float* dwte, float* dwpe, const float* dout, const std::int32_t* order,
                             const std::int32_t* start, const std::int32_t* token, int segments, int B, int T, int C) {
  if (segments > 0) {
    const dim3 grid(static_cast<unsigned>((C + 127) / 128), static_cast<unsigned>(segments < 65535 ? segments : 65535));
    embedding_wte_backward_kernel<<<grid, 128, 0, as_stream(stream)>>>(dwte, dout, order, start, token, segments, C);
    launched("gpt embedding backward (wte)");
  }
  const std::size_t n = static_cast<std::size_t>(T) * C;
  embedding_wpe_backward_kernel<<<blocks_for(n, kThreads), kThreads, 0, as_stream(stream)>>>(dwpe, dout, B, T, C);
  launched("gpt embedding backward (wpe)");
}

void cuda_cross_entropy(void* stream, float* logits, float* losses, const std::int32_t* targets, int N, int V,
                        float grad_scale) {
  if (N == 0) return;
  cross_entropy_kernel<<<N, kThreads, 0, as_stream(stream)>>>(logits, losses, targets, V, grad_scale);
  launched("gpt cross-entropy");
}

void cuda_axpby(void* stream, float* acc, float acc_scale, const float* x, float x_scale, std::size_t n) {
  axpby_kernel<<<blocks_for(n, kThreads), kThreads, 0, as_stream(stream)>>>(acc, acc_scale, x, x_scale, n);
  launched("gpt elementwise");
}

}  // namespace strata::model::detail
