// The Llama family's operations on the host device that the GPT's (models/gpt/ops.h) do not
// cover: linear layers in Hugging Face's layout (W [out, in], y = x W^T + b) through the same
// oneDNN GEMM, RMSNorm, the rotary embedding in Hugging Face's rotate-half layout, SwiGLU,
// causal grouped-query attention and an embedding without positions. Row-major fp32; N = rows
// (batch x sequence); q is [N, heads x head_dim], k and v [N, kv_heads x head_dim], query
// head h reads kv head h / (heads / kv_heads). Backward functions accumulate (+=) into
// parameter gradients and say for each input gradient whether it is written or accumulated.
// Reductions run in fixed blocks in a fixed order (models/gpt/parallel.h): the same bits for
// any thread count.
//
// ops_reference.h has a plain double-accumulating loop version of each, which the tests
// hold these against.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "models/gpt/gemm.h"

namespace strata::model::llama {

using ops::Products;

// out[N,OC] = inp[N,IC] W[OC,IC]^T + b[OC] (b may be null).
void linear_forward(float* out, const float* inp, const float* W, const float* b, int N, int IC, int OC,
                    Products p = Products::fp32);
// dinp[N,IC] = (or += with accumulate) dout W.
void linear_backward_input(float* dinp, const float* dout, const float* W, int N, int IC, int OC, bool accumulate,
                           Products p = Products::fp32);
// dW[OC,IC] += dout^T inp; db[OC] += the column sums of dout (db may be null).
void linear_backward_weight(float* dW, float* db, const float* dout, const float* inp, int N, int IC, int OC,
                            Products p = Products::fp32);

// out = w * x / sqrt(mean(x^2) + eps) per row of C; rstd[N] kept for backward.
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N, int C, float eps);
// dinp[N,C] = (or += with accumulate) the input's gradient; dw[C] += the weight's.
void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w, const float* rstd,
                      int N, int C, bool accumulate);
// rmsnorm_backward's two halves apart (it is these two calls: the same bits): the input's
// gradient, and the weight's.
void rmsnorm_backward_input(float* dinp, const float* dout, const float* inp, const float* w, const float* rstd, int N,
                            int C, bool accumulate);
void rmsnorm_backward_weight(float* dw, const float* dout, const float* inp, const float* rstd, int N, int C);

// cos and sin [T, head_dim/2] of position t times each inverse frequency (config.h).
void rope_tables(float* cos, float* sin, const std::vector<double>& inv_freq, int T);
// In place over x [B, T, heads x hd]: each head's halves (a, b) -> (a cos - b sin, b cos + a sin).
void rope_forward(float* x, const float* cos, const float* sin, int B, int T, int heads, int hd);
// In place: the rotation's transpose (dx from dy).
void rope_backward(float* dx, const float* cos, const float* sin, int B, int T, int heads, int hd);

// out = silu(gate) * up, silu(g) = g / (1 + exp(-g)).
void swiglu_forward(float* out, const float* gate, const float* up, std::size_t n);
// dgate, dup (written) from dout.
void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, std::size_t n);

// Causal grouped-query attention with scores q.k / sqrt(hd): out [N, heads x hd]. state
// (attention_state_floats) keeps what backward needs: each row's log-sum-exp [B, heads, T],
// then a copy of out; linear in T (no T x T probabilities).
std::size_t attention_state_floats(int B, int T, int heads, int hd);
void attention_forward(float* out, float* state, const float* q, const float* k, const float* v, int B, int T,
                       int heads, int kv_heads, int hd);
// dq, dk, dv written.
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                        const float* v, const float* state, int B, int T, int heads, int kv_heads, int hd);

// out[n] = table[tokens[n]] (rows of C).
void embedding_forward(float* out, const std::int32_t* tokens, const float* table, int N, int C);
// dtable[tokens[n]] += dout[n]: each token's rows summed from zero in row order, then added to
// its row once (a tied head's part first, then this: the order a pipeline's tie adds them).
void embedding_backward(float* dtable, const float* dout, const std::int32_t* tokens, int N, int C);

}  // namespace strata::model::llama
