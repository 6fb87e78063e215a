// One Llama-family block: h = x + o(attn(rope(norm_q(q)), rope(norm_k(k)), v)) over
// q, k, v = in_norm(x) W^T (+ b), then out = h + down(silu(gate(post_norm(h))) * up(...)),
// with the activations its backward needs (LlamaActs) and the gradients it produces. Weights
// and gradients come as fp32 pointers by slot (config.h: LlamaSlot; slots the shape lacks are
// null); weight gradients are accumulated (+=). Buffers are sized for at most B x T tokens and
// used for any smaller batch. The operations run through LlamaDims::kernels (kernels.h): every
// pointer is memory of their device.
#pragma once

#include <array>
#include <cstddef>

#include "models/gpt/gemm.h"
#include "models/llama/config.h"

namespace strata::model {

class LlamaKernels;

struct LlamaDims {
  int B = 1, T = 1;
  const LlamaShape* shape = nullptr;
  const float* cos = nullptr;  // rotary tables [T, head_dim / 2] (ops.h)
  const float* sin = nullptr;
  ops::Products products = ops::Products::fp32;
  LlamaKernels* kernels = nullptr;  // where the operations run (kernels.h); null: the host
  bool full_scores = false;         // the kernels keep [B,heads,T,T] probabilities (CUDA's)
  std::size_t tokens() const noexcept { return static_cast<std::size_t>(B) * static_cast<std::size_t>(T); }
};

using LlamaWeights = std::array<const float*, kLlamaSlots>;
using LlamaGrads = std::array<float*, kLlamaSlots>;

// Activations kept from forward for backward.
struct LlamaActs {
  float *h1, *rstd1, *qpre, *kpre, *qrstd, *krstd, *q, *k, *v, *att, *y, *res1, *h2, *rstd2, *gate, *up, *act;
  static std::size_t floats(const LlamaDims& d);  // for the largest B x T
  void carve(float* base, const LlamaDims& d);
};

// Backward's temporaries, shared by every block.
struct LlamaScratch {
  float *dh, *dy, *dq, *dk, *dv, *dqn, *dkn, *dgate, *dup, *dact;
  static std::size_t floats(const LlamaDims& d);
  void carve(float* base, const LlamaDims& d);
};

// What llama_block_backward_input keeps for llama_block_backward_weight: the gradients at
// the products' outputs (dgate and dup; dres1, at the o projection's output; dq, dk and dv as
// the q, k and v projections see them) and at the RMSNorms' outputs (dh2: post-attention;
// dh1: input; with q/k norm, dqn and dkn: the q and k norms', after the rotary's backward,
// which their weights read; null without q/k norm).
struct LlamaSplit {
  float *dgate, *dup, *dh2, *dres1, *dqn, *dkn, *dq, *dk, *dv, *dh1;
  static std::size_t floats(const LlamaDims& d);  // for the largest B x T
  void carve(float* base, const LlamaDims& d);
};

// out = block(x); out must not alias x.
void llama_block_forward(float* out, const float* x, const LlamaWeights& w, const LlamaActs& a, const LlamaDims& d);
// dres holds dL/d(out) on entry and dL/dx on return; weight gradients are added into g.
void llama_block_backward(float* dres, const float* x, const LlamaWeights& w, const LlamaGrads& g, const LlamaActs& a,
                          const LlamaScratch& s, const LlamaDims& d);

// llama_block_backward in two passes (the Zero Bubble split): the input pass turns dres from
// dL/d(out) into dL/dx and fills `k`, with scratch s (its dact and dy only); the weight pass,
// given dL/d(out) again and the same activations and `k`, adds the weight gradients into g.
// Each gradient gets the bits llama_block_backward gives it (the same calls on the same
// operands, each RMSNorm's backward as its two halves: kernels.h).
void llama_block_backward_input(float* dres, const float* x, const LlamaWeights& w, const LlamaActs& a,
                                const LlamaSplit& k, const LlamaScratch& s, const LlamaDims& d);
void llama_block_backward_weight(const LlamaGrads& g, const float* dout, const float* x, const LlamaActs& a,
                                 const LlamaSplit& k, const LlamaDims& d);

}  // namespace strata::model
