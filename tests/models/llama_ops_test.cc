// The Llama family's host operations (models/llama/ops.h) against their plain
// double-accumulating references (ops_reference.h), within the fp32 sum bound of each op's
// longest sum (tests/support/fp32_bound.h); bitwise reproducibility across thread counts; and
// config.json read as Hugging Face defines it (keys used, refused by name).
#include <tbb/global_control.h>
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <vector>

#include "models/llama/config.h"
#include "models/llama/ops.h"
#include "models/llama/ops_reference.h"
#include "runtime/core/error.h"
#include "tests/support/error_of.h"
#include "tests/support/fp32_bound.h"
#include "tests/support/randn.h"

using namespace strata;
using namespace strata::model;
using strata::test::max_abs;
using strata::test::randn;
using strata::test::require_close;

TEST_CASE("linear layers in Hugging Face's layout match the reference", "[llama][ops]") {
  const int N = 37, IC = 48, OC = 40;
  auto x = randn(std::size_t(N) * IC, 1), W = randn(std::size_t(OC) * IC, 2, 0.2f), b = randn(OC, 3),
       dy = randn(std::size_t(N) * OC, 4);
  std::vector<float> y(std::size_t(N) * OC), yr(y.size());
  llama::linear_forward(y.data(), x.data(), W.data(), b.data(), N, IC, OC);
  llama::ref::linear_forward(yr.data(), x.data(), W.data(), b.data(), N, IC, OC);
  require_close(y, yr, IC + 1, IC * max_abs(x) * max_abs(W) + max_abs(b), "forward");
  for (bool acc : {false, true}) {
    std::vector<float> dx(std::size_t(N) * IC, 0.5f), dxr = dx;
    llama::linear_backward_input(dx.data(), dy.data(), W.data(), N, IC, OC, acc);
    llama::ref::linear_backward_input(dxr.data(), dy.data(), W.data(), N, IC, OC, acc);
    require_close(dx, dxr, OC + 1, OC * max_abs(dy) * max_abs(W) + 0.5, "dinp");
  }
  std::vector<float> dW = randn(W.size(), 5), dWr = dW, db = randn(OC, 6), dbr = db;
  llama::linear_backward_weight(dW.data(), db.data(), dy.data(), x.data(), N, IC, OC);
  llama::ref::linear_backward_weight(dWr.data(), dbr.data(), dy.data(), x.data(), N, IC, OC);
  require_close(dW, dWr, N + 1, N * max_abs(dy) * max_abs(x) + 4, "dW");
  require_close(db, dbr, N + 1, N * max_abs(dy) + 4, "db");
}

TEST_CASE("RMSNorm forward and backward match the reference", "[llama][ops]") {
  const int N = 45, C = 96;
  auto x = randn(std::size_t(N) * C, 11, 3.0f), w = randn(C, 12), dy = randn(x.size(), 13);
  std::vector<float> y(x.size()), yr(x.size()), r(N), rr(N);
  llama::rmsnorm_forward(y.data(), r.data(), x.data(), w.data(), N, C, 1e-6f);
  llama::ref::rmsnorm_forward(yr.data(), rr.data(), x.data(), w.data(), N, C, 1e-6f);
  require_close(r, rr, 4, max_abs(rr), "rstd");
  // y = w x r: three roundings of one product.
  require_close(y, yr, 4, max_abs(w) * max_abs(x) * max_abs(rr), "forward");
  for (bool acc : {false, true}) {
    std::vector<float> dx(x.size(), 0.25f), dxr = dx, dw = randn(C, 14), dwr = dw;
    llama::rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rr.data(), N, C, acc);
    llama::ref::rmsnorm_backward(dxr.data(), dwr.data(), dy.data(), x.data(), w.data(), rr.data(), N, C, acc);
    const double r3 = max_abs(rr) * max_abs(rr) * max_abs(rr);
    require_close(
        dx, dxr, C + 4,
        max_abs(rr) * max_abs(w) * max_abs(dy) + C * max_abs(x) * max_abs(x) * r3 * max_abs(w) * max_abs(dy) + 0.25,
        "dinp");
    require_close(dw, dwr, N + 4, N * max_abs(dy) * max_abs(x) * max_abs(rr) + 4, "dw");
  }
}

TEST_CASE("the rotary embedding matches the reference and its backward is its transpose", "[llama][ops]") {
  LlamaShape s;
  s.head_dim = 16;
  s.rope_theta = 500000.0;
  s.rope = {RopeScaling::Kind::llama3, 8.0, 1.0, 4.0, 64};
  const int B = 2, T = 33, H = 3, D = s.head_dim;
  const auto f = rope_inv_freq(s);
  REQUIRE(f.size() == std::size_t(D / 2));
  std::vector<float> c(std::size_t(T) * D / 2), sn(c.size()), cr(c.size()), sr(c.size());
  llama::rope_tables(c.data(), sn.data(), f, T);
  llama::ref::rope_tables(cr.data(), sr.data(), f, T);
  CHECK(c == cr);
  CHECK(sn == sr);
  auto x = randn(std::size_t(B) * T * H * D, 21), xr = x;
  llama::rope_forward(x.data(), c.data(), sn.data(), B, T, H, D);
  llama::ref::rope_forward(xr.data(), c.data(), sn.data(), B, T, H, D);
  require_close(x, xr, 3, 2 * max_abs(xr), "forward");
  // <R x, y> == <x, R^T y>
  auto a = randn(x.size(), 22), bb = randn(x.size(), 23), ra = a, rtb = bb;
  llama::rope_forward(ra.data(), c.data(), sn.data(), B, T, H, D);
  llama::rope_backward(rtb.data(), c.data(), sn.data(), B, T, H, D);
  double l = 0, r = 0, mag = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    l += double(ra[i]) * bb[i];
    r += double(a[i]) * rtb[i];
    mag += std::abs(double(a[i]) * bb[i]);
  }
  CHECK(std::abs(l - r) <= strata::test::gamma_k(4) * 2 * mag);
}

TEST_CASE("llama3 rope scaling follows its three frequency bands", "[llama][ops]") {
  LlamaShape s;
  s.head_dim = 128;
  s.rope_theta = 500000.0;
  const auto plain = rope_inv_freq(s);
  s.rope = {RopeScaling::Kind::llama3, 8.0, 1.0, 4.0, 8192};
  const auto scaled = rope_inv_freq(s);
  const double pi = std::acos(-1.0);
  int high = 0, low = 0, mid = 0;
  for (std::size_t i = 0; i < plain.size(); ++i) {
    const double wavelen = 2 * pi / plain[i];
    if (wavelen < 8192 / 4.0) {
      CHECK(scaled[i] == plain[i]);
      ++high;
    } else if (wavelen > 8192 / 1.0) {
      CHECK(scaled[i] == Approx(plain[i] / 8.0).epsilon(1e-15));
      ++low;
    } else {
      CHECK(scaled[i] < plain[i]);
      CHECK(scaled[i] > plain[i] / 8.0);
      ++mid;
    }
  }
  CHECK(high > 0);
  CHECK(low > 0);
  CHECK(mid > 0);
  s.rope = {RopeScaling::Kind::linear, 4.0};
  CHECK(rope_inv_freq(s)[3] == plain[3] / 4.0);
}

TEST_CASE("SwiGLU and the embedding match the reference", "[llama][ops]") {
  const std::size_t n = 5000;
  auto g = randn(n, 31, 3.0f), u = randn(n, 32), d = randn(n, 33);
  std::vector<float> y(n), yr(n), dg(n), du(n), dgr(n), dur(n);
  llama::swiglu_forward(y.data(), g.data(), u.data(), n);
  llama::ref::swiglu_forward(yr.data(), g.data(), u.data(), n);
  require_close(y, yr, 8, max_abs(g) * max_abs(u), "forward");
  llama::swiglu_backward(dg.data(), du.data(), d.data(), g.data(), u.data(), n);
  llama::ref::swiglu_backward(dgr.data(), dur.data(), d.data(), g.data(), u.data(), n);
  require_close(du, dur, 8, max_abs(d) * max_abs(g), "dup");
  require_close(dg, dgr, 12, max_abs(d) * max_abs(u) * (1 + max_abs(g)), "dgate");
  const int N = 50, C = 20, V = 7;
  std::vector<std::int32_t> tok(N);
  for (int i = 0; i < N; ++i) tok[std::size_t(i)] = (i * 5) % V;
  auto table = randn(std::size_t(V) * C, 34), dy = randn(std::size_t(N) * C, 35);
  std::vector<float> e(std::size_t(N) * C), er(e.size());
  llama::embedding_forward(e.data(), tok.data(), table.data(), N, C);
  llama::ref::embedding_forward(er.data(), tok.data(), table.data(), N, C);
  CHECK(e == er);
  auto dt = randn(table.size(), 36), dtr = dt;
  llama::embedding_backward(dt.data(), dy.data(), tok.data(), N, C);
  llama::ref::embedding_backward(dtr.data(), dy.data(), tok.data(), N, C);
  require_close(dt, dtr, N + 1, N * max_abs(dy) + 4, "dtable");
}

TEST_CASE("grouped-query attention matches the reference and is reproducible across thread counts", "[llama][ops]") {
  // One partial tile (19 rows) and three of 64 with a partial last one (150).
  const int T = GENERATE(19, 150);
  for (auto [H, KV] : {std::pair{4, 2}, {4, 1}, {3, 3}}) {
    const int B = 2, D = 8, lq = H * D, lk = KV * D;
    auto q = randn(std::size_t(B) * T * lq, 41), k = randn(std::size_t(B) * T * lk, 42),
         v = randn(std::size_t(B) * T * lk, 43), dy = randn(q.size(), 44);
    std::vector<float> y(q.size()), yr(q.size()), state(llama::attention_state_floats(B, T, H, D)),
        attr(std::size_t(B) * H * T * T);
    llama::attention_forward(y.data(), state.data(), q.data(), k.data(), v.data(), B, T, H, KV, D);
    llama::ref::attention_forward(yr.data(), attr.data(), q.data(), k.data(), v.data(), B, T, H, KV, D);
    // Scores: D-long dots; softmax: T-long sums; outputs: T-long sums of probabilities x v.
    require_close(y, yr, T + D + 8, max_abs(v) * (1 + D * max_abs(q) * max_abs(k)), "output");
    std::vector<float> dq(q.size()), dk(k.size()), dv(v.size()), dqr(q.size()), dkr(k.size()), dvr(v.size());
    llama::attention_backward(dq.data(), dk.data(), dv.data(), dy.data(), q.data(), k.data(), v.data(), state.data(), B,
                              T, H, KV, D);
    llama::ref::attention_backward(dqr.data(), dkr.data(), dvr.data(), dy.data(), q.data(), k.data(), v.data(),
                                   attr.data(), B, T, H, KV, D);
    const int group = H / KV;
    const double dp = D * max_abs(dy) * max_abs(v);
    require_close(dv, dvr, group * T + 4, group * T * max_abs(dy), "dv");
    require_close(dq, dqr, 2 * T + D + 4, T * 2 * dp * max_abs(k), "dq");
    require_close(dk, dkr, group * T + 2 * T + D + 4, group * T * 2 * dp * max_abs(q), "dk");
    std::vector<float> dq1(q.size()), dk1(k.size()), dv1(v.size());
    {
      tbb::global_control one(tbb::global_control::max_allowed_parallelism, 1);
      llama::attention_backward(dq1.data(), dk1.data(), dv1.data(), dy.data(), q.data(), k.data(), v.data(),
                                state.data(), B, T, H, KV, D);
    }
    CHECK(dq1 == dq);
    CHECK(dk1 == dk);
    CHECK(dv1 == dv);
  }
}

namespace {
nlohmann::json base_config(const char* type) {
  return {{"model_type", type},     {"vocab_size", 300},         {"hidden_size", 64},        {"intermediate_size", 96},
          {"num_hidden_layers", 2}, {"num_attention_heads", 4},  {"num_key_value_heads", 2}, {"rms_norm_eps", 1e-5},
          {"rope_theta", 10000.0},  {"torch_dtype", "bfloat16"}, {"architectures", {"X"}}};
}
}  // namespace

TEST_CASE("config.json: each model type's keys are used, and what is not implemented is refused by name",
          "[llama][config]") {
  auto c = base_config("qwen3");
  c["head_dim"] = 24;
  c["tie_word_embeddings"] = true;
  c["attention_bias"] = false;
  c["some_new_key"] = 1;
  auto s = parse_hf_config(c, "cfg.json");
  CHECK(s.head_dim == 24);
  CHECK(s.qk_norm);
  CHECK(s.tied);
  CHECK_FALSE(s.qkv_bias);
  CHECK(s.unread_keys == std::vector<std::string>{"some_new_key"});
  const auto params = llama_params(s);
  CHECK(params.front().name == "model.embed_tokens.weight");
  CHECK(params.back().name == "model.norm.weight");
  CHECK(params[2].name == "model.layers.0.self_attn.q_proj.weight");
  CHECK(params[2].shape == std::vector<std::int64_t>{4 * 24, 64});
  s = parse_hf_config(base_config("qwen2"), "cfg.json");
  CHECK(s.qkv_bias);
  CHECK_FALSE(s.o_bias);
  CHECK_FALSE(s.tied);
  CHECK(llama_params(s).back().name == "lm_head.weight");
  auto refused = [](nlohmann::json j) { return test::error_of([&] { parse_hf_config(j, "cfg.json"); }); };
  auto moe = base_config("qwen3");
  moe["num_experts"] = 8;
  CHECK_THAT(refused(moe), Catch::Contains("cfg.json") && Catch::Contains("'num_experts'"));
  auto rope = base_config("llama");
  rope["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  CHECK_THAT(refused(rope), Catch::Contains("rope_scaling type 'yarn'"));
  auto act = base_config("mistral");
  act["hidden_act"] = "gelu";
  CHECK_THAT(refused(act), Catch::Contains("hidden_act 'gelu'"));
  auto bias = base_config("llama");
  bias["mlp_bias"] = true;
  CHECK_THAT(refused(bias), Catch::Contains("mlp_bias"));
  auto kv = base_config("llama");
  kv["num_key_value_heads"] = 3;
  CHECK_THAT(refused(kv), Catch::Contains("num_key_value_heads 3"));
  auto type = base_config("gemma");
  CHECK_THAT(refused(type), Catch::Contains("model_type 'gemma'"));
  auto missing = base_config("llama");
  missing.erase("hidden_size");
  CHECK_THAT(refused(missing), Catch::Contains("'hidden_size' is missing"));
  auto window = base_config("mistral");
  window["sliding_window"] = 64;
  const auto w = parse_hf_config(window, "cfg.json");
  validate_seq_len(w, 64);
  CHECK_THAT(test::error_of([&] { validate_seq_len(w, 65); }), Catch::Contains("sliding_window 64"));
}
