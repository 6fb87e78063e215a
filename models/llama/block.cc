// The Llama-family block's forward and backward (see block.h) from the ops of ops.h, through
// the dims' kernels.
#include "models/llama/block.h"

#include "models/llama/kernels.h"
#include "models/llama/ops.h"

namespace strata::model {
namespace {
struct Sizes {
  std::size_t n, nc, nq, nkv, ni, att;
};
Sizes sizes(const LlamaDims& d) {
  const LlamaShape& s = *d.shape;
  const std::size_t n = d.tokens();
  return {n,
          n * static_cast<std::size_t>(s.hidden),
          n * static_cast<std::size_t>(s.heads) * static_cast<std::size_t>(s.head_dim),
          n * static_cast<std::size_t>(s.kv_heads) * static_cast<std::size_t>(s.head_dim),
          n * static_cast<std::size_t>(s.intermediate),
          d.full_scores ? static_cast<std::size_t>(d.B) * static_cast<std::size_t>(s.heads) *
                              static_cast<std::size_t>(d.T) * static_cast<std::size_t>(d.T)
                        : llama::attention_state_floats(d.B, d.T, s.heads, s.head_dim)};
}
LlamaKernels& kernels_of(const LlamaDims& d) { return d.kernels != nullptr ? *d.kernels : host_llama_kernels(); }
struct Carver {
  float* p;
  float* operator()(std::size_t n) {
    float* r = p;
    p += n;
    return r;
  }
};
}  // namespace

std::size_t LlamaActs::floats(const LlamaDims& d) {
  const Sizes z = sizes(d);
  const std::size_t qk_norm = d.shape->qk_norm ? z.nq + z.nkv + z.n * (d.shape->heads + d.shape->kv_heads) : 0;
  return 3 * z.nc + 2 * z.n + qk_norm + 2 * z.nq + 2 * z.nkv + z.att + 3 * z.ni;
}

void LlamaActs::carve(float* base, const LlamaDims& d) {
  const Sizes z = sizes(d);
  const bool qkn = d.shape->qk_norm;
  Carver take{base};
  h1 = take(z.nc);
  rstd1 = take(z.n);
  qpre = qkn ? take(z.nq) : nullptr;
  kpre = qkn ? take(z.nkv) : nullptr;
  qrstd = qkn ? take(z.n * static_cast<std::size_t>(d.shape->heads)) : nullptr;
  krstd = qkn ? take(z.n * static_cast<std::size_t>(d.shape->kv_heads)) : nullptr;
  q = take(z.nq);
  k = take(z.nkv);
  v = take(z.nkv);
  att = take(z.att);
  y = take(z.nq);
  res1 = take(z.nc);
  h2 = take(z.nc);
  rstd2 = take(z.n);
  gate = take(z.ni);
  up = take(z.ni);
  act = take(z.ni);
}

std::size_t LlamaScratch::floats(const LlamaDims& d) {
  const Sizes z = sizes(d);
  return z.nc + 3 * z.nq + 3 * z.nkv + 3 * z.ni;
}

void LlamaScratch::carve(float* base, const LlamaDims& d) {
  const Sizes z = sizes(d);
  Carver take{base};
  dh = take(z.nc);
  dy = take(z.nq);
  dq = take(z.nq);
  dqn = take(z.nq);
  dk = take(z.nkv);
  dv = take(z.nkv);
  dkn = take(z.nkv);
  dgate = take(z.ni);
  dup = take(z.ni);
  dact = take(z.ni);
}

std::size_t LlamaSplit::floats(const LlamaDims& d) {
  const Sizes z = sizes(d);
  return 2 * z.ni + 3 * z.nc + (d.shape->qk_norm ? z.nq + z.nkv : 0) + z.nq + 2 * z.nkv;
}

void LlamaSplit::carve(float* base, const LlamaDims& d) {
  const Sizes z = sizes(d);
  const bool qkn = d.shape->qk_norm;
  Carver take{base};
  dgate = take(z.ni);
  dup = take(z.ni);
  dh2 = take(z.nc);
  dres1 = take(z.nc);
  dqn = qkn ? take(z.nq) : nullptr;
  dkn = qkn ? take(z.nkv) : nullptr;
  dq = take(z.nq);
  dk = take(z.nkv);
  dv = take(z.nkv);
  dh1 = take(z.nc);
}

void llama_block_forward(float* out, const float* x, const LlamaWeights& w, const LlamaActs& a, const LlamaDims& d) {
  const LlamaShape& s = *d.shape;
  const int N = static_cast<int>(d.tokens()), C = s.hidden, D = s.head_dim, I = s.intermediate;
  const int Q = s.heads * D, KV = s.kv_heads * D;
  const float eps = static_cast<float>(s.rms_eps);
  const auto p = d.products;
  LlamaKernels& ker = kernels_of(d);
  const std::size_t NC = static_cast<std::size_t>(N) * C, NI = static_cast<std::size_t>(N) * I;
  ker.rmsnorm_forward(a.h1, a.rstd1, x, w[in_norm], N, C, eps);
  float* q = s.qk_norm ? a.qpre : a.q;
  float* k = s.qk_norm ? a.kpre : a.k;
  {
    const auto h1 = ker.gpt().round_once(p, a.h1, NC);  // three products read it
    ker.linear_forward(q, a.h1, w[q_w], w[q_b], N, C, Q, p);
    ker.linear_forward(k, a.h1, w[k_w], w[k_b], N, C, KV, p);
    ker.linear_forward(a.v, a.h1, w[v_w], w[v_b], N, C, KV, p);
  }
  if (s.qk_norm) {
    ker.rmsnorm_forward(a.q, a.qrstd, a.qpre, w[q_norm], N * s.heads, D, eps);
    ker.rmsnorm_forward(a.k, a.krstd, a.kpre, w[k_norm], N * s.kv_heads, D, eps);
  }
  ker.rope_forward(a.q, d.cos, d.sin, d.B, d.T, s.heads, D);
  ker.rope_forward(a.k, d.cos, d.sin, d.B, d.T, s.kv_heads, D);
  ker.attention_forward(a.y, a.att, a.q, a.k, a.v, d.B, d.T, s.heads, s.kv_heads, D);
  ker.linear_forward(a.res1, a.y, w[o_w], w[o_b], N, Q, C, p);
  ker.gpt().accumulate(a.res1, x, NC);
  ker.rmsnorm_forward(a.h2, a.rstd2, a.res1, w[post_norm], N, C, eps);
  {
    const auto h2 = ker.gpt().round_once(p, a.h2, NC);
    ker.linear_forward(a.gate, a.h2, w[gate_w], nullptr, N, C, I, p);
    ker.linear_forward(a.up, a.h2, w[up_w], nullptr, N, C, I, p);
  }
  ker.swiglu_forward(a.act, a.gate, a.up, NI);
  ker.linear_forward(out, a.act, w[down_w], nullptr, N, I, C, p);
  ker.gpt().accumulate(out, a.res1, NC);
}

void llama_block_backward(float* dres, const float* x, const LlamaWeights& w, const LlamaGrads& g, const LlamaActs& a,
                          const LlamaScratch& sc, const LlamaDims& d) {
  const LlamaShape& s = *d.shape;
  const int N = static_cast<int>(d.tokens()), C = s.hidden, D = s.head_dim, I = s.intermediate;
  const int Q = s.heads * D, KV = s.kv_heads * D;
  const auto p = d.products;
  LlamaKernels& ker = kernels_of(d);
  const std::size_t NC = static_cast<std::size_t>(N) * C, NI = static_cast<std::size_t>(N) * I;
  const std::size_t NQ = static_cast<std::size_t>(N) * Q, NKV = static_cast<std::size_t>(N) * KV;
  GptKernels& gk = ker.gpt();
  // Each product's output gradient feeds its input and weight gradients, and h2 and h1 feed
  // two and three weight gradients: each is rounded once for all (round_once), and the
  // products keep the order of every sum (dh: gate's, then up's; q's, k's, v's).
  // MLP branch: dres is dL/d(out), which is also the residual's share of dL/d(res1).
  {
    const auto once = gk.round_once(p, dres, NC);
    ker.linear_backward_input(sc.dact, dres, w[down_w], N, I, C, false, p);
    ker.linear_backward_weight(g[down_w], nullptr, dres, a.act, N, I, C, p);
  }
  ker.swiglu_backward(sc.dgate, sc.dup, sc.dact, a.gate, a.up, NI);
  {
    const auto h2 = gk.round_once(p, a.h2, NC);
    {
      const auto once = gk.round_once(p, sc.dgate, NI);
      ker.linear_backward_input(sc.dh, sc.dgate, w[gate_w], N, C, I, false, p);
      ker.linear_backward_weight(g[gate_w], nullptr, sc.dgate, a.h2, N, C, I, p);
    }
    const auto once = gk.round_once(p, sc.dup, NI);
    ker.linear_backward_input(sc.dh, sc.dup, w[up_w], N, C, I, true, p);
    ker.linear_backward_weight(g[up_w], nullptr, sc.dup, a.h2, N, C, I, p);
  }
  ker.rmsnorm_backward(dres, g[post_norm], sc.dh, a.res1, w[post_norm], a.rstd2, N, C, true);
  // Attention branch: dres is now dL/d(res1).
  {
    const auto once = gk.round_once(p, dres, NC);
    ker.linear_backward_input(sc.dy, dres, w[o_w], N, Q, C, false, p);
    ker.linear_backward_weight(g[o_w], g[o_b], dres, a.y, N, Q, C, p);
  }
  ker.attention_backward(sc.dq, sc.dk, sc.dv, sc.dy, a.q, a.k, a.v, a.att, d.B, d.T, s.heads, s.kv_heads, D);
  ker.rope_backward(sc.dq, d.cos, d.sin, d.B, d.T, s.heads, D);
  ker.rope_backward(sc.dk, d.cos, d.sin, d.B, d.T, s.kv_heads, D);
  const float* dq = sc.dq;
  const float* dk = sc.dk;
  if (s.qk_norm) {
    ker.rmsnorm_backward(sc.dqn, g[q_norm], sc.dq, a.qpre, w[q_norm], a.qrstd, N * s.heads, D, false);
    ker.rmsnorm_backward(sc.dkn, g[k_norm], sc.dk, a.kpre, w[k_norm], a.krstd, N * s.kv_heads, D, false);
    dq = sc.dqn;
    dk = sc.dkn;
  }
  {
    const auto h1 = gk.round_once(p, a.h1, NC);
    {
      const auto once = gk.round_once(p, dq, NQ);
      ker.linear_backward_input(sc.dh, dq, w[q_w], N, C, Q, false, p);
      ker.linear_backward_weight(g[q_w], g[q_b], dq, a.h1, N, C, Q, p);
    }
    {
      const auto once = gk.round_once(p, dk, NKV);
      ker.linear_backward_input(sc.dh, dk, w[k_w], N, C, KV, true, p);
      ker.linear_backward_weight(g[k_w], g[k_b], dk, a.h1, N, C, KV, p);
    }
    const auto once = gk.round_once(p, sc.dv, NKV);
    ker.linear_backward_input(sc.dh, sc.dv, w[v_w], N, C, KV, true, p);
    ker.linear_backward_weight(g[v_w], g[v_b], sc.dv, a.h1, N, C, KV, p);
  }
  ker.rmsnorm_backward(dres, g[in_norm], sc.dh, x, w[in_norm], a.rstd1, N, C, true);
}

// llama_block_backward's operations in its order, each product's and each RMSNorm's two
// halves apart: the input pass keeps what the weight pass reads (LlamaSplit).
void llama_block_backward_input(float* dres, const float* x, const LlamaWeights& w, const LlamaActs& a,
                                const LlamaSplit& k, const LlamaScratch& sc, const LlamaDims& d) {
  const LlamaShape& s = *d.shape;
  const int N = static_cast<int>(d.tokens()), C = s.hidden, D = s.head_dim, I = s.intermediate;
  const int Q = s.heads * D, KV = s.kv_heads * D;
  const auto p = d.products;
  LlamaKernels& ker = kernels_of(d);
  ker.linear_backward_input(sc.dact, dres, w[down_w], N, I, C, false, p);
  ker.swiglu_backward(k.dgate, k.dup, sc.dact, a.gate, a.up, static_cast<std::size_t>(N) * I);
  ker.linear_backward_input(k.dh2, k.dgate, w[gate_w], N, C, I, false, p);
  ker.linear_backward_input(k.dh2, k.dup, w[up_w], N, C, I, true, p);
  ker.rmsnorm_backward_input(dres, k.dh2, a.res1, w[post_norm], a.rstd2, N, C, true);
  ker.gpt().copy(k.dres1, dres, static_cast<std::size_t>(N) * C);
  ker.linear_backward_input(sc.dy, k.dres1, w[o_w], N, Q, C, false, p);
  float* dq = s.qk_norm ? k.dqn : k.dq;
  float* dk = s.qk_norm ? k.dkn : k.dk;
  ker.attention_backward(dq, dk, k.dv, sc.dy, a.q, a.k, a.v, a.att, d.B, d.T, s.heads, s.kv_heads, D);
  ker.rope_backward(dq, d.cos, d.sin, d.B, d.T, s.heads, D);
  ker.rope_backward(dk, d.cos, d.sin, d.B, d.T, s.kv_heads, D);
  if (s.qk_norm) {
    ker.rmsnorm_backward_input(k.dq, k.dqn, a.qpre, w[q_norm], a.qrstd, N * s.heads, D, false);
    ker.rmsnorm_backward_input(k.dk, k.dkn, a.kpre, w[k_norm], a.krstd, N * s.kv_heads, D, false);
  }
  ker.linear_backward_input(k.dh1, k.dq, w[q_w], N, C, Q, false, p);
  ker.linear_backward_input(k.dh1, k.dk, w[k_w], N, C, KV, true, p);
  ker.linear_backward_input(k.dh1, k.dv, w[v_w], N, C, KV, true, p);
  ker.rmsnorm_backward_input(dres, k.dh1, x, w[in_norm], a.rstd1, N, C, true);
}

void llama_block_backward_weight(const LlamaGrads& g, const float* dout, const float* x, const LlamaActs& a,
                                 const LlamaSplit& k, const LlamaDims& d) {
  const LlamaShape& s = *d.shape;
  const int N = static_cast<int>(d.tokens()), C = s.hidden, D = s.head_dim, I = s.intermediate;
  const int Q = s.heads * D, KV = s.kv_heads * D;
  const auto p = d.products;
  LlamaKernels& ker = kernels_of(d);
  ker.linear_backward_weight(g[down_w], nullptr, dout, a.act, N, I, C, p);
  ker.linear_backward_weight(g[gate_w], nullptr, k.dgate, a.h2, N, C, I, p);
  ker.linear_backward_weight(g[up_w], nullptr, k.dup, a.h2, N, C, I, p);
  ker.rmsnorm_backward_weight(g[post_norm], k.dh2, a.res1, a.rstd2, N, C);
  ker.linear_backward_weight(g[o_w], g[o_b], k.dres1, a.y, N, Q, C, p);
  if (s.qk_norm) {
    ker.rmsnorm_backward_weight(g[q_norm], k.dqn, a.qpre, a.qrstd, N * s.heads, D);
    ker.rmsnorm_backward_weight(g[k_norm], k.dkn, a.kpre, a.krstd, N * s.kv_heads, D);
  }
  ker.linear_backward_weight(g[q_w], g[q_b], k.dq, a.h1, N, C, Q, p);
  ker.linear_backward_weight(g[k_w], g[k_b], k.dk, a.h1, N, C, KV, p);
  ker.linear_backward_weight(g[v_w], g[v_b], k.dv, a.h1, N, C, KV, p);
  ker.rmsnorm_backward_weight(g[in_norm], k.dh1, x, a.rstd1, N, C);
}

}  // namespace strata::model
