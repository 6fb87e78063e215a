// The GPT's GPU arithmetic (gpt_cuda.cu), behind CudaKernels (cuda_kernels.h): cuBLAS
// products and kernels that follow ops.h's host loops, every call enqueued on the caller's
// CUDA stream (a cudaStream_t; `blas` is a cuBLAS handle bound to it). Pointers are device
// memory; shapes and meanings are ops.h's. Row-major everywhere. Built without CUDA, every
// call throws Errc::unsupported.
#pragma once

#include <cstddef>
#include <cstdint>

#include "models/gpt/gemm.h"

namespace strata::model::detail {

// C = alpha op(A) op(B) + beta C in `p` precision: fp32 (no TF32), or operands rounded to
// bf16 / fp16 with fp32 sums (cuBLAS's FAST_16BF / FAST_16F compute types).
void cuda_gemm(void* blas, ops::Products p, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
               const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc);
// `batch` products in `p` precision (as cuda_gemm), the i-th on A + i sA, B + i sB, C + i sC.
void cuda_gemm_batched(void* blas, ops::Products p, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                       const float* A, int lda, long long sA, const float* B, int ldb, long long sB, float beta,
                       float* C, int ldc, long long sC, int batch);

// out[n, :] = b for every row n < N.
void cuda_fill_rows(void* stream, float* out, const float* b, int N, int C);
// acc[c] += the sum over rows n of x[n, c] (the same order of sums on every run).
void cuda_column_sums(void* stream, float* acc, const float* x, int N, int C);

void cuda_layernorm_forward(void* stream, float* out, float* mean, float* rstd, const float* inp, const float* w,
                            const float* b, int N, int C);
void cuda_layernorm_backward_input(void* stream, float* dinp, const float* dout, const float* inp, const float* w,
                                   const float* mean, const float* rstd, int N, int C);
void cuda_layernorm_backward_weight(void* stream, float* dw, float* db, const float* dout, const float* inp,
                                    const float* mean, const float* rstd, int N, int C);

void cuda_gelu_forward(void* stream, float* out, const float* inp, std::size_t n);
void cuda_gelu_backward(void* stream, float* dinp, const float* inp, const float* dout, std::size_t n);

// Row r of the [rows, T] score matrices is query position r % T: softmax over its first
// r % T + 1 entries, zeros after them (in place).
void cuda_causal_softmax(void* stream, float* att, int rows, int T);
// ds = p * (ds - rowsum(p * ds)) on the same causal entries, zeros after them.
void cuda_causal_softmax_backward(void* stream, float* ds, const float* p, int rows, int T);

// out[n, :] = wte[tokens[n], :] + wpe[n % T, :] for n < N.
void cuda_embedding_forward(void* stream, float* out, const std::int32_t* tokens, const float* wte, const float* wpe,
                            int N, int T, int C);
// Segment s holds the rows order[start[s] .. start[s+1]) of token token[s] (rows ascending):
// dwte[token[s], :] += (their dout rows summed from zero in that order);
// dwpe[t, :] += dout[b T + t, :] for b = 0 .. B-1 in turn.
void cuda_embedding_backward(void* stream, float* dwte, float* dwpe, const float* dout, const std::int32_t* order,
                             const std::int32_t* start, const std::int32_t* token, int segments, int B, int T, int C);

// ops::cross_entropy's row work: losses[n], and logits replaced by the scaled gradient.
void cuda_cross_entropy(void* stream, float* logits, float* losses, const std::int32_t* targets, int N, int V,
                        float grad_scale);

// acc = acc_scale acc + x_scale x (accumulate: 1, 1; scale: x null).
void cuda_axpby(void* stream, float* acc, float acc_scale, const float* x, float x_scale, std::size_t n);

}  // namespace strata::model::detail
