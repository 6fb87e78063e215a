// The Llama family's GPU arithmetic (llama_cuda.cu), behind CudaLlamaKernels
// (cuda_kernels.h): kernels that follow ops.h's host loops, every call enqueued on the
// caller's CUDA stream (a cudaStream_t). The products, the causal softmax and the column sums
// are the GPT's (models/gpt/detail/gpt_cuda.h). Pointers are device memory; shapes and
// meanings are ops.h's. Row reductions give each row one warp whose lanes take fixed columns
// and meet in a fixed shuffle order; column reductions split the rows between a fixed set of
// threads and add their parts in a fixed order: a GPU run repeats its bits. Built without
// CUDA, every call throws Errc::unsupported.
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata::model::detail {

// out = w * (x * rstd), rstd = 1 / sqrt(mean(x^2) + eps) with the sum of squares in double.
void cuda_rmsnorm_forward(void* stream, float* out, float* rstd, const float* inp, const float* w, int N, int C,
                          float eps);
// dinp = (or += with accumulate) r (w dout) - x r^3 / C sum_c (w dout x)_c (the sum in double).
void cuda_rmsnorm_backward_input(void* stream, float* dinp, const float* dout, const float* inp, const float* w,
                                 const float* rstd, int N, int C, bool accumulate);
// dw[c] += sum over rows n of dout[n, c] (x[n, c] rstd[n]).
void cuda_rmsnorm_backward_weight(void* stream, float* dw, const float* dout, const float* inp, const float* rstd,
                                  int N, int C);

// In place over x [B T, heads x hd]: each head's halves (a, b) -> (a cos - b s, b cos + a s),
// s = sign sin (sign -1: the transpose, backward's).
void cuda_rope(void* stream, float* x, const float* cos, const float* sin, int B, int T, int heads, int hd, float sign);

void cuda_swiglu_forward(void* stream, float* out, const float* gate, const float* up, std::size_t n);
void cuda_swiglu_backward(void* stream, float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                          std::size_t n);

// out[n, :] = table[tokens[n], :] for n < N.
void cuda_embedding_forward(void* stream, float* out, const std::int32_t* tokens, const float* table, int N, int C);
// Segment s holds the rows order[start[s] .. start[s+1]) of token token[s], ascending
// (models/gpt/cuda_kernels.h: group_rows_by_token): dtable[token[s], :] += each of their dout
// rows in turn, the host's order of additions.
void cuda_embedding_backward(void* stream, float* dtable, const float* dout, const std::int32_t* order,
                             const std::int32_t* start, const std::int32_t* token, int segments, int C);

}  // namespace strata::model::detail
