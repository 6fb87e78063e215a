// The GPT block's forward and backward (see block.h), composed from the kernels' operations (kernels.h).
#include "models/gpt/block.h"

#include "models/gpt/config.h"
#include "models/gpt/fp8_products.h"
#include "models/gpt/kernels.h"
#include "models/gpt/ops.h"
#include "models/gpt/unit_scale.h"

namespace strata::model {

namespace {
// What the attention's forward keeps for its backward (kernels.h).
std::size_t attention_floats(const BlockDims& d) {
  return d.full_scores ? static_cast<std::size_t>(d.B) * static_cast<std::size_t>(d.NH) * d.T * d.T
                       : ops::attention_state_floats(d.B, d.T, d.C, d.NH);
}
}  // namespace

std::size_t BlockActs::floats(const BlockDims& d) {
  const std::size_t N = d.tokens(), C = static_cast<std::size_t>(d.C);
  return 15 * N * C + 4 * N + attention_floats(d);
}

void BlockActs::carve(float* p, const BlockDims& d) {
  const std::size_t N = d.tokens(), C = static_cast<std::size_t>(d.C);
  auto take = [&p](std::size_t n) {
    float* r = p;
    p += n;
    return r;
  };
  ln1 = take(N * C);
  ln1_mean = take(N);
  ln1_rstd = take(N);
  qkv = take(3 * N * C);
  att = take(attention_floats(d));
  atty = take(N * C);
  res1 = take(N * C);
  ln2 = take(N * C);
  ln2_mean = take(N);
  ln2_rstd = take(N);
  fch = take(4 * N * C);
  gelu = take(4 * N * C);
}

std::size_t BlockScratch::floats(const BlockDims& d) { return 10 * d.tokens() * static_cast<std::size_t>(d.C); }

void BlockScratch::carve(float* p, const BlockDims& d) {
  const std::size_t NC = d.tokens() * static_cast<std::size_t>(d.C);
  auto take = [&p](std::size_t n) {
    float* r = p;
    p += n;
    return r;
  };
  dres1 = take(NC);
  d4 = take(4 * NC);
  dln = take(NC);
  datty = take(NC);
  dqkv = take(3 * NC);
}

std::size_t BlockSplit::floats(const BlockDims& d) {
  return (d.unit != nullptr ? 11 : 10) * d.tokens() * static_cast<std::size_t>(d.C);
}

void BlockSplit::carve(float* p, const BlockDims& d) {
  const std::size_t NC = d.tokens() * static_cast<std::size_t>(d.C);
  d4 = p;
  dln2 = d4 + 4 * NC;
  dres1 = dln2 + NC;
  dqkv = dres1 + NC;
  dln1 = dqkv + 3 * NC;
  dbranch = d.unit != nullptr ? dln1 + NC : nullptr;
}

namespace {

GptKernels& K(const BlockDims& d) { return d.kernels != nullptr ? *d.kernels : host_kernels(); }

ops::ProductScales scales(const BlockDims& d, int k, int N) {
  return d.unit != nullptr ? d.unit->product(k, N) : ops::ProductScales{};
}

// Product k of the block (0 qkv, 1 attention projection, 2 MLP up, 3 MLP down): in the
// block's precision, or with FP8 operands at its site; unit-scaled with its scales.
void mm_forward(const BlockDims& d, int k, float* out, const float* inp, const float* W, const float* b, int N, int IC,
                int OC) {
  if (d.fp8 != nullptr) {
    d.fp8->forward(4 * d.block + k, out, inp, W, b, N, IC, OC, scales(d, k, N));
  } else {
    K(d).matmul_forward(out, inp, W, b, N, IC, OC, d.products, scales(d, k, N));
  }
}

void mm_backward(const BlockDims& d, int k, float* dinp, float* dW, float* db, const float* dout, const float* inp,
                 const float* W, int N, int IC, int OC) {
  if (d.fp8 != nullptr) {
    d.fp8->backward(4 * d.block + k, dinp, dW, db, dout, inp, W, N, IC, OC, false, scales(d, k, N));
  } else {
    K(d).matmul_backward(dinp, dW, db, dout, inp, W, N, IC, OC, d.products, scales(d, k, N));
  }
}

// Product k's backward halves (the pipeline's B and W passes), as mm_backward takes them.
void mm_backward_input(const BlockDims& d, int k, float* dinp, const float* dout, const float* W, int N, int IC,
                       int OC) {
  if (d.fp8 != nullptr) {
    d.fp8->backward_input(4 * d.block + k, dinp, dout, W, N, IC, OC, false, scales(d, k, N));
  } else {
    K(d).matmul_backward_input(dinp, dout, W, N, IC, OC, false, d.products, scales(d, k, N));
  }
}

void mm_backward_weight(const BlockDims& d, int k, float* dW, float* db, const float* dout, const float* inp, int N,
                        int IC, int OC) {
  if (d.fp8 != nullptr) {
    d.fp8->backward_weight(4 * d.block + k, dW, db, dout, inp, N, IC, OC, scales(d, k, N));
  } else {
    K(d).matmul_backward_weight(dW, db, dout, inp, N, IC, OC, d.products, scales(d, k, N));
  }
}

// The residual add's two gradients: skip = (its weight) x g, and g scaled in place by the
// branch's weight (1 and 1 in the plain block: a copy).
void residual_split(float* skip, float* g, const BlockDims& d, int add, std::size_t n) {
  if (d.unit == nullptr) {
    K(d).copy(skip, g, n);
    return;
  }
  const int j = 2 * d.block + add;
  const float a = UnitScales::skip(j);
  K(d).copy(skip, g, n);
  K(d).scale(skip, a, n);
  K(d).scale(g, UnitScales::branch(j), n);
}

float score_scale(const BlockDims& d) { return d.unit != nullptr ? d.unit->scores() : ops::score_scale(d.C / d.NH); }

// bf16 matmuls take bf16 attention products too (PyTorch's autocast does); fp16 and FP8 keep
// fp32 there (unit-scaled scores and probabilities far from 1 are not fp16's range).
ops::Products attention_products(const BlockDims& d) {
  return d.products == ops::Products::bf16 ? ops::Products::bf16 : ops::Products::fp32;
}

// acc = the residual add of skip and the branch output in acc.
void residual_add(float* acc, const float* skip, const BlockDims& d, int add, std::size_t n) {
  if (d.unit == nullptr) {
    K(d).accumulate(acc, skip, n);
  } else {
    const int j = 2 * d.block + add;
    K(d).weighted_add(acc, UnitScales::branch(j), skip, UnitScales::skip(j), n);
  }
}

}  // namespace

void block_forward(float* out, const float* x, const BlockWeights& w, const BlockActs& a, const BlockDims& d) {
  const int N = static_cast<int>(d.tokens()), C = d.C;
  const std::size_t NC = d.tokens() * static_cast<std::size_t>(C);
  K(d).layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, w[ln1_w], w[ln1_b], N, C);
  mm_forward(d, 0, a.qkv, a.ln1, w[qkv_w], w[qkv_b], N, C, 3 * C);
  K(d).attention_forward(a.atty, a.att, a.qkv, d.B, d.T, C, d.NH, score_scale(d), attention_products(d));
  if (d.unit != nullptr) K(d).scale(a.atty, d.unit->attention(), NC);
  mm_forward(d, 1, a.res1, a.atty, w[attproj_w], w[attproj_b], N, C, C);
  residual_add(a.res1, x, d, 0, NC);
  K(d).layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res1, w[ln2_w], w[ln2_b], N, C);
  mm_forward(d, 2, a.fch, a.ln2, w[fc_w], w[fc_b], N, C, 4 * C);
  K(d).gelu_forward(a.gelu, a.fch, 4 * NC);
  if (d.unit != nullptr) K(d).scale(a.gelu, UnitScales::gelu(), 4 * NC);
  mm_forward(d, 3, out, a.gelu, w[fcproj_w], w[fcproj_b], N, 4 * C, C);
  residual_add(out, a.res1, d, 1, NC);
}

void block_backward(float* dres, const float* x, const BlockWeights& w, const BlockGrads& g, const BlockActs& a,
                    const BlockScratch& s, const BlockDims& d) {
  const int N = static_cast<int>(d.tokens()), C = d.C;
  const std::size_t NC = d.tokens() * static_cast<std::size_t>(C);
  // out = res1 + mlp(res1): dres1 = dout + (the MLP branch's gradient, added by ln_2's backward)
  residual_split(s.dres1, dres, d, 1, NC);
  mm_backward(d, 3, s.d4, g[fcproj_w], g[fcproj_b], dres, a.gelu, w[fcproj_w], N, 4 * C, C);
  if (d.unit != nullptr) K(d).scale(s.d4, UnitScales::gelu(), 4 * NC);
  K(d).gelu_backward(s.d4, a.fch, s.d4, 4 * NC);
  mm_backward(d, 2, s.dln, g[fc_w], g[fc_b], s.d4, a.ln2, w[fc_w], N, C, 4 * C);
  K(d).layernorm_backward(s.dres1, g[ln2_w], g[ln2_b], s.dln, a.res1, w[ln2_w], a.ln2_mean, a.ln2_rstd, N, C);
  // res1 = x + attn(ln_1(x))
  residual_split(dres, s.dres1, d, 0, NC);
  mm_backward(d, 1, s.datty, g[attproj_w], g[attproj_b], s.dres1, a.atty, w[attproj_w], N, C, C);
  if (d.unit != nullptr) K(d).scale(s.datty, d.unit->attention(), NC);
  K(d).attention_backward(s.dqkv, s.datty, a.qkv, a.att, d.B, d.T, C, d.NH, score_scale(d), attention_products(d));
  mm_backward(d, 0, s.dln, g[qkv_w], g[qkv_b], s.dqkv, a.ln1, w[qkv_w], N, C, 3 * C);
  K(d).layernorm_backward(dres, g[ln1_w], g[ln1_b], s.dln, x, w[ln1_w], a.ln1_mean, a.ln1_rstd, N, C);
}

// block_backward's operations in its order, each product's two halves apart: the input pass
// keeps what the weight pass reads (BlockSplit).
void block_backward_input(float* dres, const float* x, const BlockWeights& w, const BlockActs& a, const BlockSplit& k,
                          const BlockDims& d) {
  const int N = static_cast<int>(d.tokens()), C = d.C;
  const std::size_t NC = d.tokens() * static_cast<std::size_t>(C);
  residual_split(k.dres1, dres, d, 1, NC);
  if (d.unit != nullptr) K(d).copy(k.dbranch, dres, NC);
  mm_backward_input(d, 3, k.d4, dres, w[fcproj_w], N, 4 * C, C);
  if (d.unit != nullptr) K(d).scale(k.d4, UnitScales::gelu(), 4 * NC);
  K(d).gelu_backward(k.d4, a.fch, k.d4, 4 * NC);
  mm_backward_input(d, 2, k.dln2, k.d4, w[fc_w], N, C, 4 * C);
  K(d).layernorm_backward_input(k.dres1, k.dln2, a.res1, w[ln2_w], a.ln2_mean, a.ln2_rstd, N, C);
  residual_split(dres, k.dres1, d, 0, NC);
  float* datty = k.dln1;  // consumed by the attention's backward before dln1 is written
  mm_backward_input(d, 1, datty, k.dres1, w[attproj_w], N, C, C);
  if (d.unit != nullptr) K(d).scale(datty, d.unit->attention(), NC);
  K(d).attention_backward(k.dqkv, datty, a.qkv, a.att, d.B, d.T, C, d.NH, score_scale(d), attention_products(d));
  mm_backward_input(d, 0, k.dln1, k.dqkv, w[qkv_w], N, C, 3 * C);
  K(d).layernorm_backward_input(dres, k.dln1, x, w[ln1_w], a.ln1_mean, a.ln1_rstd, N, C);
}

void block_backward_weight(const BlockGrads& g, const float* dout, const float* x, const BlockActs& a,
                           const BlockSplit& k, const BlockDims& d) {
  const int N = static_cast<int>(d.tokens()), C = d.C;
  const float* dbranch = d.unit != nullptr ? k.dbranch : dout;  // the plain add's branch weight is 1
  mm_backward_weight(d, 3, g[fcproj_w], g[fcproj_b], dbranch, a.gelu, N, 4 * C, C);
  mm_backward_weight(d, 2, g[fc_w], g[fc_b], k.d4, a.ln2, N, C, 4 * C);
  K(d).layernorm_backward_weight(g[ln2_w], g[ln2_b], k.dln2, a.res1, a.ln2_mean, a.ln2_rstd, N, C);
  mm_backward_weight(d, 1, g[attproj_w], g[attproj_b], k.dres1, a.atty, N, C, C);
  mm_backward_weight(d, 0, g[qkv_w], g[qkv_b], k.dqkv, a.ln1, N, C, 3 * C);
  K(d).layernorm_backward_weight(g[ln1_w], g[ln1_b], k.dln1, x, a.ln1_mean, a.ln1_rstd, N, C);
}

}  // namespace strata::model
