// The GPT's operations on the host device: forward and backward of the linear layers
// (oneDNN through gemm.h), LayerNorm, tanh-GELU, causal multi-head attention (tiled per head,
// flash_attention.h), the embeddings, residual adds and the fused softmax cross-entropy; the
// rest is TBB-parallel loops, elementwise and row work in xsimd batches (parallel.h).
// Every tensor is row-major fp32; N = rows (batch x sequence).
// Backward functions accumulate (+=) into parameter gradients, so one buffer can collect
// several uses of a weight (the tied embedding), and say for each input gradient whether it
// is written or accumulated. Every reduction is split into fixed blocks summed in a fixed
// order, so results are bitwise reproducible for any thread count and run.
//
// ops_reference.h has a plain loop version of each (double accumulation) that the tests
// hold these against.
#pragma once

#include <cstddef>
#include <cstdint>

#include "models/gpt/gemm.h"

namespace strata::model::ops {

inline constexpr float kLayerNormEps = 1e-5f;

// A scaled matrix product's three scales (unit scaling, models/gpt/unit_scale.h): the forward
// product, the input's gradient and the weight's gradient each have their own. 1: the plain
// product.
struct ProductScales {
  float fwd = 1.0f, grad_in = 1.0f, grad_w = 1.0f;
};

// out[N,OC] = fwd (inp[N,IC] W[IC,OC]) + b[OC]; b may be null.
void matmul_forward(float* out, const float* inp, const float* W, const float* b, int N, int IC, int OC,
                    Products p = Products::fp32, const ProductScales& s = {});
// dinp[N,IC] = (or += with accumulate) grad_in (dout W^T); dW[IC,OC] += grad_w (inp^T dout);
// db[OC] += the column sums of dout (db may be null; not scaled).
void matmul_backward(float* dinp, float* dW, float* db, const float* dout, const float* inp, const float* W, int N,
                     int IC, int OC, bool accumulate, Products p = Products::fp32, const ProductScales& s = {});
// matmul_backward's two halves, for a backward split into input (B) and weight (W) passes.
void matmul_backward_input(float* dinp, const float* dout, const float* W, int N, int IC, int OC, bool accumulate,
                           Products p = Products::fp32, const ProductScales& s = {});
void matmul_backward_weight(float* dW, float* db, const float* dout, const float* inp, int N, int IC, int OC,
                            Products p = Products::fp32, const ProductScales& s = {});
// db[OC] += the column sums of dout[N,OC] (matmul_backward's bias part).
void bias_backward(float* db, const float* dout, int N, int OC);

// out = (inp - mean) * rstd * w + b per row; mean and rstd [N] kept for backward.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b, int N,
                       int C);
// dinp[N,C] += ..., dw[C] += ..., db[C] += ...
void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                        const float* mean, const float* rstd, int N, int C);
// Its two halves: dinp += ... (B), and dw += ..., db += ... (W).
void layernorm_backward_input(float* dinp, const float* dout, const float* inp, const float* w, const float* mean,
                              const float* rstd, int N, int C);
void layernorm_backward_weight(float* dw, float* db, const float* dout, const float* inp, const float* mean,
                               const float* rstd, int N, int C);

// GELU with the tanh approximation (GPT-2's): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
void gelu_forward(float* out, const float* inp, std::size_t n);
// dinp = dout * GELU'(inp)
void gelu_backward(float* dinp, const float* inp, const float* dout, std::size_t n);

// out = a + b
void residual_forward(float* out, const float* a, const float* b, std::size_t n);
// acc += x
void accumulate(float* acc, const float* x, std::size_t n);
// x *= s
void scale(float* x, float s, std::size_t n);
// acc = acc_scale * acc + x_scale * x (unit scaling's weighted residual add)
void weighted_add(float* acc, float acc_scale, const float* x, float x_scale, std::size_t n);

// out[B,T,C] = wte[tokens[b,t]] + wpe[t]
void embedding_forward(float* out, const std::int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C);
// dwte[tokens[b,t]] += dout[b,t] (each token's rows summed first, in row order, then added);
// dwpe[t] += sum over b of dout[b,t]
void embedding_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens, int B, int T, int C);

// Causal multi-head self-attention. qkv [B,T,3C] holds q, k, v side by side (head h at
// columns h*hs of each); out [B,T,C] the heads' outputs side by side. The scores are
// score_scale q.k (score_scale(hs) = 1/sqrt(hs), GPT-2's, unless the unit-scaled model sets
// its own). state (attention_state_floats) keeps what backward needs: each row's log-sum-exp
// of its scores [B,NH,T], then a copy of out [B,T,C]; linear in T (no T x T probabilities).
std::size_t attention_state_floats(int B, int T, int C, int NH);
void attention_forward(float* out, float* state, const float* qkv, int B, int T, int C, int NH, float score_scale);
// dqkv [B,T,3C] = (written) the gradient of qkv.
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* state, int B, int T, int C,
                        int NH, float score_scale);
float score_scale(int head_size);

// Softmax cross-entropy over logits [N,V] against targets [N], fused with its gradient:
// writes each row's loss into losses[N] and replaces logits with
// (softmax - onehot(target)) * grad_scale. Returns the sum of the losses (double).
double cross_entropy(float* logits, float* losses, const std::int32_t* targets, int N, int V, float grad_scale);

}  // namespace strata::model::ops

namespace strata::model::ops {
// The tied LM head: logits[N,V] = fwd (inp[N,C] wte[V,C]^T).
void lm_head_forward(float* logits, const float* inp, const float* wte, int N, int C, int V,
                     Products p = Products::fp32, const ProductScales& s = {});
// dinp[N,C] = grad_in (dlogits wte) (written); dwte[V,C] += grad_w (dlogits^T inp).
void lm_head_backward(float* dinp, float* dwte, const float* dlogits, const float* inp, const float* wte, int N, int C,
                      int V, Products p = Products::fp32, const ProductScales& s = {});
}  // namespace strata::model::ops
