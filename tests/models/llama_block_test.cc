// The Llama-family block's split backward (models/llama/block.h: llama_block_backward_input /
// _weight, the Zero Bubble split) gives the input gradient and every weight gradient the bits
// the fused llama_block_backward gives them, on the host kernels, for a Llama shape, a Qwen2
// shape (q/k/v biases) and a Qwen3 shape (q/k norms), in fp32 and bf16 products, into zeroed
// gradients and accumulated onto existing ones.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "models/llama/block.h"
#include "models/llama/ops.h"
#include "tests/support/same_bits.h"

using namespace strata;
using namespace strata::model;

namespace {

LlamaShape block_shape(const std::string& kind) {
  LlamaShape s;
  s.layers = 1;
  s.hidden = 32;
  s.intermediate = 48;
  s.heads = 4;
  s.kv_heads = 2;
  s.head_dim = 12;  // heads x head_dim = 48, not the hidden size: the q and o products are not square
  s.vocab = 64;
  s.max_positions = 64;
  s.rms_eps = 1e-6;
  if (kind == "qwen2") {
    s.model_type = "qwen2";
    s.qkv_bias = true;
  } else if (kind == "qwen3") {
    s.model_type = "qwen3";
    s.qk_norm = true;
  }
  return s;
}

std::vector<float> normal(std::size_t n, std::mt19937& rng, float mean, float sd) {
  std::normal_distribution<float> dist(mean, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

using test::same_bits;

}  // namespace

TEST_CASE("the Llama block's split backward gives the fused backward's bits", "[llama][block]") {
  const std::string kind = GENERATE("llama", "qwen2", "qwen3");
  const ops::Products products = GENERATE(ops::Products::fp32, ops::Products::bf16);
  const bool accumulate = GENERATE(false, true);
  INFO(kind << (products == ops::Products::bf16 ? " bf16" : " fp32") << (accumulate ? " accumulating" : ""));
  const LlamaShape s = block_shape(kind);
  const int B = 2, T = 8;
  const std::size_t N = static_cast<std::size_t>(B * T), NC = N * static_cast<std::size_t>(s.hidden);
  std::mt19937 rng(kind.size() * 7 + (accumulate ? 1 : 0));

  // The block's parameters in slot order, as llama_params registers them (norms near one,
  // biases and weights small, so every gradient is far from zero).
  const auto slots = llama_block_slots(s);
  std::vector<LlamaParam> params;
  for (const auto& p : llama_params(s))
    if (p.layer == 1) params.push_back(p);
  REQUIRE(params.size() == slots.size());
  std::vector<std::vector<float>> w_store, g_init;
  LlamaWeights w{};
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto n = static_cast<std::size_t>(
        std::accumulate(params[i].shape.begin(), params[i].shape.end(), std::int64_t{1}, std::multiplies<>()));
    const bool norm = params[i].shape.size() == 1 && slots[i] != q_b && slots[i] != k_b && slots[i] != v_b;
    w_store.push_back(normal(n, rng, norm ? 1.0f : 0.0f, norm ? 0.1f : 0.2f));
    g_init.push_back(accumulate ? normal(n, rng, 0.0f, 1.0f) : std::vector<float>(n, 0.0f));
  }
  for (std::size_t i = 0; i < slots.size(); ++i) w[slots[i]] = w_store[i].data();

  std::vector<float> cos(static_cast<std::size_t>(T * s.head_dim / 2)), sin(cos.size());
  llama::rope_tables(cos.data(), sin.data(), rope_inv_freq(s), T);
  LlamaDims d;
  d.B = B;
  d.T = T;
  d.shape = &s;
  d.cos = cos.data();
  d.sin = sin.data();
  d.products = products;

  const auto x = normal(NC, rng, 0.0f, 1.0f);
  const auto dout = normal(NC, rng, 0.0f, 1.0f);
  std::vector<float> acts_mem(LlamaActs::floats(d)), out(NC);
  LlamaActs a{};
  a.carve(acts_mem.data(), d);
  llama_block_forward(out.data(), x.data(), w, a, d);
  const std::vector<float> acts_before = acts_mem;

  auto grads = [&](std::vector<std::vector<float>>& store) {
    store = g_init;
    LlamaGrads g{};
    for (std::size_t i = 0; i < slots.size(); ++i) g[slots[i]] = store[i].data();
    return g;
  };

  // The fused backward.
  std::vector<std::vector<float>> fused_g;
  const LlamaGrads gf = grads(fused_g);
  std::vector<float> fused_dx = dout, scratch_mem(LlamaScratch::floats(d));
  LlamaScratch sc{};
  sc.carve(scratch_mem.data(), d);
  llama_block_backward(fused_dx.data(), x.data(), w, gf, a, sc, d);

  // The split: B, then W with dL/d(out) again (scratch dirtied in between: W must not read it).
  std::vector<std::vector<float>> split_g;
  const LlamaGrads gs = grads(split_g);
  std::vector<float> split_dx = dout, split_mem(LlamaSplit::floats(d));
  LlamaSplit k{};
  k.carve(split_mem.data(), d);
  std::fill(scratch_mem.begin(), scratch_mem.end(), std::nanf(""));
  llama_block_backward_input(split_dx.data(), x.data(), w, a, k, sc, d);
  std::fill(scratch_mem.begin(), scratch_mem.end(), std::nanf(""));
  llama_block_backward_weight(gs, dout.data(), x.data(), a, k, d);

  CHECK(same_bits(acts_mem, acts_before));  // neither backward writes the activations
  CHECK(same_bits(split_dx, fused_dx));
  for (std::size_t i = 0; i < slots.size(); ++i) {
    INFO(params[i].name);
    CHECK(same_bits(split_g[i], fused_g[i]));
    CHECK(!same_bits(fused_g[i], g_init[i]));  // every gradient was written: the comparison means something
  }
}
