// One GPT block: x -> x + attn(ln_1(x)) -> (that) + mlp(ln_2(that)) (unit-scaled:
// with the scales and weighted adds of unit_scale.h), with the activations its backward needs (BlockActs) and the
// gradients it produces. Weights and gradients come as fp32 pointers in BlockParam order (config.h); weight gradients
// are accumulated (+=). Buffers are sized for at most B x T tokens and used for any smaller batch: every offset is
// computed from the call's B and T. Pointers are memory of the kernels' device; FP8 sites and
// unit scaling run on the host kernels only.
#pragma once

#include <array>
#include <cstddef>

#include "models/gpt/gemm.h"

namespace strata::model {

class Fp8Products;
class GptKernels;
class UnitScales;

struct BlockDims {
  int B = 1, T = 1, C = 1, NH = 1;
  ops::Products products = ops::Products::fp32;  // precision of the weight products
  Fp8Products* fp8 = nullptr;                    // when set, the weight products take FP8 operands (fp8_products.h)
  int block = 0;                                 // which block this is (its FP8 sites)
  const UnitScales* unit = nullptr;              // when set, the unit-scaled block (unit_scale.h)
  GptKernels* kernels = nullptr;                 // where the operations run (kernels.h); null: the host
  bool full_scores = false;                      // the kernels keep [B,NH,T,T] probabilities (CUDA's)
  std::size_t tokens() const noexcept { return static_cast<std::size_t>(B) * static_cast<std::size_t>(T); }
};

using BlockWeights = std::array<const float*, 12>;
using BlockGrads = std::array<float*, 12>;

// Activations kept from forward for backward.
struct BlockActs {
  float *ln1, *ln1_mean, *ln1_rstd, *qkv, *att, *atty, *res1, *ln2, *ln2_mean, *ln2_rstd, *fch, *gelu;
  static std::size_t floats(const BlockDims& d);  // for the largest B x T
  void carve(float* base, const BlockDims& d);    // points the fields into base
};

// Backward's temporaries, shared by every block.
struct BlockScratch {
  float *dres1, *d4, *dln, *datty, *dqkv;
  static std::size_t floats(const BlockDims& d);
  void carve(float* base, const BlockDims& d);
};

// What block_backward_input keeps for block_backward_weight: the gradients at the outputs of
// the four products and of the two LayerNorms' affine parts (unit-scaled, the MLP branch's
// gradient too: dL/d(out) times the residual add's branch weight; null otherwise).
struct BlockSplit {
  float *d4, *dln2, *dres1, *dqkv, *dln1, *dbranch;
  static std::size_t floats(const BlockDims& d);
  void carve(float* base, const BlockDims& d);
};

// out = block(x); out must not alias x.
void block_forward(float* out, const float* x, const BlockWeights& w, const BlockActs& a, const BlockDims& d);
// dres holds dL/d(out) on entry and dL/dx on return; weight gradients are added into g.
void block_backward(float* dres, const float* x, const BlockWeights& w, const BlockGrads& g, const BlockActs& a,
                    const BlockScratch& s, const BlockDims& d);

// block_backward in two passes (the Zero Bubble split): the input pass turns dres from
// dL/d(out) into dL/dx and fills `k`; the weight pass, given dL/d(out) again, adds the weight
// gradients into g. Each gradient gets the bits block_backward gives it, plain, unit-scaled
// or with FP8 sites (each half quantizes what it reads at the step's scales).
void block_backward_input(float* dres, const float* x, const BlockWeights& w, const BlockActs& a, const BlockSplit& k,
                          const BlockDims& d);
void block_backward_weight(const BlockGrads& g, const float* dout, const float* x, const BlockActs& a,
                           const BlockSplit& k, const BlockDims& d);

}  // namespace strata::model
