// The Llama family on a CUDA device against the host ([cuda]: skipped with the reason where
// no GPU is present). Each kernel (models/llama/kernels.h) gets the host kernel's inputs and
// gives its values: bit for bit where the arithmetic is the same sequence of fp32 operations
// (the embedding and its gradient, which keeps the host's order of additions; RMSNorm's
// backward halves against its fused call), otherwise
// within twice the fp32 sum bound of the op's longest sum (tests/support/fp32_bound.h: each
// side is within one bound of the exact value), within the GPT's bf16 bound for bf16
// products. A whole pass (LlamaPass: every block, the head, the loss) gives the host pass's
// loss and every parameter's gradient for a Llama (GQA, untied head) and a Qwen3-style shape
// (q/k norms, q/k/v biases, tied head), with and without re-materialization, and the same bits
// on a second GPU run.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "models/gpt/array_access.h"
#include "models/llama/kernels.h"
#include "models/llama/llama.h"
#include "models/llama/ops.h"
#include "models/llama/ops_reference.h"
#include "models/llama/pass.h"
#include "runtime/core/random.h"
#include "runtime/device/device.h"
#include "tests/support/cuda_arrays.h"
#include "tests/support/fp32_bound.h"
#include "tests/support/randn.h"

using namespace strata;
using namespace strata::model;
using strata::test::max_abs;
using strata::test::randn;

namespace {

// Reads back through the Llama kernels' GPT stream.
struct Gpu : test::CudaArrays {
  std::vector<float> down(LlamaKernels& k, const float* d, std::size_t n) { return CudaArrays::down(k.gpt(), d, n); }
};

// Two fp32 evaluations of a length-K sum, each within gamma_K of the exact one: 2 gamma_K
// apart at most (gamma_2K >= 2 gamma_K).
void close_to(const std::vector<float>& got, const std::vector<float>& want, std::size_t K, double scale,
              const char* what) {
  for (float x : got) REQUIRE(std::isfinite(x));
  strata::test::require_close(got, want, 2 * K, scale, what);
}

void check_bits(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  INFO(what);
  REQUIRE(got.size() == want.size());
  CHECK(std::memcmp(got.data(), want.data(), got.size() * 4) == 0);
}

// max |got - want| <= tol * max |want| (a whole pass: many sums of changed order in a row).
void check_normwise(const std::vector<float>& got, const std::vector<float>& want, double tol, const char* what) {
  INFO(what);
  REQUIRE(got.size() == want.size());
  double diff = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    REQUIRE(std::isfinite(got[i]));
    diff = std::max(diff, std::fabs(static_cast<double>(got[i]) - want[i]));
  }
  INFO("worst difference " << diff << ", scale " << max_abs(want));
  CHECK(diff <= tol * max_abs(want));
}

constexpr double kBf16 = 2e-2;  // bf16 operands (8 bits) rounded by two libraries (as the GPT's test)
// A whole pass, as the GPT's pass test: 1e-4 of each tensor's largest value (~840 fp32 epsilons).
const double kPass = 840 * static_cast<double>(std::numeric_limits<float>::epsilon());

}  // namespace

TEST_CASE("each Llama kernel on the GPU gives the host kernel's values", "[llama][cuda]") {
  Gpu g;
  const int B = 2, T = 24, C = 64, N = B * T;
  const std::size_t NC = static_cast<std::size_t>(N) * C;
  auto gpu = make_llama_kernels(*g.dev, N, static_cast<std::size_t>(B) * 4 * T * T);
  LlamaKernels& cpu = host_llama_kernels();

  SECTION("linear layers in Hugging Face's layout, fp32 and bf16") {
    for (auto p : {ops::Products::fp32, ops::Products::bf16}) {
      const int IC = C, OC = 96;
      auto x = randn(NC, 1), W = randn(static_cast<std::size_t>(OC) * IC, 2, 0.2f), b = randn(OC, 3);
      auto dy = randn(static_cast<std::size_t>(N) * OC, 4);
      std::vector<float> y(static_cast<std::size_t>(N) * OC), dx = randn(NC, 5), dW = randn(W.size(), 6), db(OC, 0.5f);
      float *gx = g.up(x), *gW = g.up(W), *gb = g.up(b), *gdy = g.up(dy), *gy = g.up(y), *gdx = g.up(dx),
            *gdW = g.up(dW), *gdb = g.up(db);
      cpu.linear_forward(y.data(), x.data(), W.data(), b.data(), N, IC, OC, p);
      gpu->linear_forward(gy, gx, gW, gb, N, IC, OC, p);
      cpu.linear_backward_input(dx.data(), dy.data(), W.data(), N, IC, OC, true, p);
      gpu->linear_backward_input(gdx, gdy, gW, N, IC, OC, true, p);
      cpu.linear_backward_weight(dW.data(), db.data(), dy.data(), x.data(), N, IC, OC, p);
      gpu->linear_backward_weight(gdW, gdb, gdy, gx, N, IC, OC, p);
      if (p == ops::Products::fp32) {
        close_to(g.down(*gpu, gy, y.size()), y, IC + 1, IC * max_abs(x) * max_abs(W) + max_abs(b), "forward");
        close_to(g.down(*gpu, gdx, dx.size()), dx, OC + 1, OC * max_abs(dy) * max_abs(W) + max_abs(dx), "dinp (+=)");
        close_to(g.down(*gpu, gdW, dW.size()), dW, N + 1, N * max_abs(dy) * max_abs(x) + 4, "dW");
      } else {
        check_normwise(g.down(*gpu, gy, y.size()), y, kBf16, "bf16 forward");
        check_normwise(g.down(*gpu, gdx, dx.size()), dx, kBf16, "bf16 dinp (+=)");
        check_normwise(g.down(*gpu, gdW, dW.size()), dW, kBf16, "bf16 dW");
      }
      close_to(g.down(*gpu, gdb, db.size()), db, N + 1, N * max_abs(dy) + 1, "db (fp32 column sums)");
    }
  }

  SECTION("RMSNorm forward and backward, rows of the hidden size and of one head") {
    for (int width : {C, 16}) {
      const int rows = static_cast<int>(NC / static_cast<std::size_t>(width));
      auto x = randn(NC, 11, 3.0f), w = randn(static_cast<std::size_t>(width), 12), dy = randn(NC, 13);
      std::vector<float> y(NC), r(static_cast<std::size_t>(rows));
      float *gx = g.up(x), *gw = g.up(w), *gdy = g.up(dy), *gy = g.up(y), *gr = g.up(r);
      cpu.rmsnorm_forward(y.data(), r.data(), x.data(), w.data(), rows, width, 1e-6f);
      gpu->rmsnorm_forward(gy, gr, gx, gw, rows, width, 1e-6f);
      close_to(g.down(*gpu, gr, r.size()), r, 4, max_abs(r), "rstd");
      close_to(g.down(*gpu, gy, NC), y, 4, max_abs(w) * max_abs(x) * max_abs(r), "forward");
      for (bool acc : {false, true}) {
        std::vector<float> dx(NC, 0.25f), dw = randn(static_cast<std::size_t>(width), 14);
        float *gdx = g.up(dx), *gdw = g.up(dw), *gr2 = g.up(r);  // both from the host's rstd
        cpu.rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), r.data(), rows, width, acc);
        gpu->rmsnorm_backward(gdx, gdw, gdy, gx, gw, gr2, rows, width, acc);
        const double r1 = max_abs(r), r3 = r1 * r1 * r1;
        close_to(g.down(*gpu, gdx, NC), dx, static_cast<std::size_t>(width) + 4,
                 r1 * max_abs(w) * max_abs(dy) + width * max_abs(x) * max_abs(x) * r3 * max_abs(w) * max_abs(dy) + 0.25,
                 acc ? "dinp (+=)" : "dinp");
        close_to(g.down(*gpu, gdw, dw.size()), dw, static_cast<std::size_t>(rows) + 4,
                 rows * max_abs(dy) * max_abs(x) * r1 + 4, "dw");
        // The halves apart (the block's B/W split) give the fused call's bits.
        std::vector<float> dx2(NC, 0.25f), dw2 = randn(static_cast<std::size_t>(width), 14);
        float *gdx2 = g.up(dx2), *gdw2 = g.up(dw2);
        gpu->rmsnorm_backward_input(gdx2, gdy, gx, gw, gr2, rows, width, acc);
        gpu->rmsnorm_backward_weight(gdw2, gdy, gx, gr2, rows, width);
        check_bits(g.down(*gpu, gdx2, NC), g.down(*gpu, gdx, NC), "dinp, the input half");
        check_bits(g.down(*gpu, gdw2, dw2.size()), g.down(*gpu, gdw, dw.size()), "dw, the weight half");
      }
    }
  }

  SECTION("the rotary embedding and its transpose") {
    LlamaShape s;
    s.head_dim = 16;
    s.rope_theta = 500000.0;
    const int H = 3, D = s.head_dim;
    std::vector<float> tables(static_cast<std::size_t>(T) * D);
    llama::rope_tables(tables.data(), tables.data() + tables.size() / 2, rope_inv_freq(s), T);
    float* gt = g.up(tables);
    const std::size_t half = tables.size() / 2;
    for (int sign : {1, -1}) {
      auto x = randn(static_cast<std::size_t>(N) * H * D, 21 + sign);
      float* gx = g.up(x);
      if (sign > 0) {
        cpu.rope_forward(x.data(), tables.data(), tables.data() + half, B, T, H, D);
        gpu->rope_forward(gx, gt, gt + half, B, T, H, D);
      } else {
        cpu.rope_backward(x.data(), tables.data(), tables.data() + half, B, T, H, D);
        gpu->rope_backward(gx, gt, gt + half, B, T, H, D);
      }
      close_to(g.down(*gpu, gx, x.size()), x, 3, 2 * max_abs(x), sign > 0 ? "forward" : "backward");
    }
  }

  SECTION("SwiGLU forward and backward") {
    const std::size_t n = 5000;
    auto gt = randn(n, 31, 3.0f), u = randn(n, 32), d = randn(n, 33);
    std::vector<float> y(n), dg(n), du(n);
    float *ggt = g.up(gt), *gu = g.up(u), *gd = g.up(d), *gy = g.up(y), *gdg = g.up(dg), *gdu = g.up(du);
    cpu.swiglu_forward(y.data(), gt.data(), u.data(), n);
    gpu->swiglu_forward(gy, ggt, gu, n);
    close_to(g.down(*gpu, gy, n), y, 8, max_abs(gt) * max_abs(u), "forward");
    cpu.swiglu_backward(dg.data(), du.data(), d.data(), gt.data(), u.data(), n);
    gpu->swiglu_backward(gdg, gdu, gd, ggt, gu, n);
    close_to(g.down(*gpu, gdu, n), du, 8, max_abs(d) * max_abs(gt), "dup");
    close_to(g.down(*gpu, gdg, n), dg, 12, max_abs(d) * max_abs(u) * (1 + max_abs(gt)), "dgate");
  }

  SECTION("causal grouped-query attention forward and backward") {
    for (auto [H, KV] : {std::pair{4, 2}, {4, 1}, {4, 4}}) {
      CAPTURE(H, KV);
      const int D = 16, lq = H * D, lk = KV * D, group = H / KV;
      auto q = randn(static_cast<std::size_t>(N) * lq, 41), k = randn(static_cast<std::size_t>(N) * lk, 42),
           v = randn(static_cast<std::size_t>(N) * lk, 43), dy = randn(q.size(), 44);
      const std::size_t att_n = static_cast<std::size_t>(B) * H * T * T;
      // The host keeps row statistics (linear in T); CUDA keeps the probabilities, checked
      // against the double-precision reference's.
      std::vector<float> y(q.size()), yr(q.size()), att(att_n), state(llama::attention_state_floats(B, T, H, D)),
          dq(q.size()), dk(k.size()), dv(v.size());
      float *gq = g.up(q), *gk = g.up(k), *gv = g.up(v), *gdy = g.up(dy), *gy = g.up(y), *ga = g.up(att),
            *gdq = g.up(dq), *gdk = g.up(dk), *gdv = g.up(dv);
      llama::ref::attention_forward(yr.data(), att.data(), q.data(), k.data(), v.data(), B, T, H, KV, D);
      cpu.attention_forward(y.data(), state.data(), q.data(), k.data(), v.data(), B, T, H, KV, D);
      gpu->attention_forward(gy, ga, gq, gk, gv, B, T, H, KV, D);
      const auto gatt = g.down(*gpu, ga, att_n);
      close_to(gatt, att, D + T + 8, 1.0 + D * max_abs(q) * max_abs(k), "probabilities");
      for (std::size_t r = 0; r < att_n / T; ++r)  // exact zeros above the diagonal
        for (std::size_t j = r % T + 1; j < static_cast<std::size_t>(T); ++j) REQUIRE(gatt[r * T + j] == 0.0f);
      close_to(g.down(*gpu, gy, y.size()), y, T + D + 8, max_abs(v) * (1 + D * max_abs(q) * max_abs(k)), "output");
      // The GPU's backward from the reference's probabilities, the host's from its own state.
      float* ga2 = g.up(att);
      cpu.attention_backward(dq.data(), dk.data(), dv.data(), dy.data(), q.data(), k.data(), v.data(), state.data(), B,
                             T, H, KV, D);
      gpu->attention_backward(gdq, gdk, gdv, gdy, gq, gk, gv, ga2, B, T, H, KV, D);
      const double dp = D * max_abs(dy) * max_abs(v);
      close_to(g.down(*gpu, gdv, dv.size()), dv, static_cast<std::size_t>(group * T + 4), group * T * max_abs(dy),
               "dv");
      close_to(g.down(*gpu, gdq, dq.size()), dq, static_cast<std::size_t>(2 * T + D + 4), T * 2 * dp * max_abs(k),
               "dq");
      close_to(g.down(*gpu, gdk, dk.size()), dk, static_cast<std::size_t>(group * T + 2 * T + D + 4),
               group * T * 2 * dp * max_abs(q), "dk");
    }
  }

  SECTION("the embedding and its gradient, rows added in the host's order") {
    const int V = 7;
    std::vector<std::int32_t> tok(static_cast<std::size_t>(N));
    for (int n = 0; n < N; ++n) tok[static_cast<std::size_t>(n)] = static_cast<std::int32_t>(splitmix64(100 + n) % V);
    auto table = randn(static_cast<std::size_t>(V) * C, 51), dy = randn(NC, 52), dt = randn(table.size(), 53);
    std::vector<float> e(NC);
    float *gtab = g.up(table), *ge = g.up(e), *gdy = g.up(dy), *gdt = g.up(dt);
    cpu.embedding_forward(e.data(), tok.data(), table.data(), N, C);
    gpu->embedding_forward(ge, tok.data(), gtab, N, C);
    check_bits(g.down(*gpu, ge, NC), e, "embedding forward");
    cpu.embedding_backward(dt.data(), dy.data(), tok.data(), N, C);
    gpu->embedding_backward(gdt, gdy, tok.data(), N, C);
    check_bits(g.down(*gpu, gdt, dt.size()), dt, "embedding gradient");
  }
}

namespace {

// Every parameter's initial values as the engine makes them for `seed`, grouped by layer,
// with the norm weights (ones) and biases (zeros) moved so that their gradients' paths are
// exercised with values that are not special.
std::vector<std::vector<NamedTensor>> perturbed_initial_params(const LlamaShape& s, std::uint64_t seed) {
  auto params = model::llama_initial_params(s, seed);
  for (auto& layer : params)
    for (auto& t : layer)
      if (t.shape.size() == 1)
        for (std::size_t i = 0; i < t.data.size(); ++i)
          t.data[i] += 0.1f * static_cast<float>(static_cast<int>(splitmix64(i) % 7) - 3);
  return params;
}

LlamaShape qwen3_style() {
  LlamaShape s;
  s.model_type = "qwen3";
  s.qk_norm = true;
  s.qkv_bias = true;
  s.tied = true;
  s.kv_heads = 1;
  return s;
}

}  // namespace

TEST_CASE("a Llama pass on the GPU gives the host pass's loss and gradients, the same bits every run",
          "[llama][cuda]") {
  const bool qwen = GENERATE(false, true);
  const Remat remat = GENERATE(Remat::never, Remat::always);
  const LlamaShape shape = qwen ? qwen3_style() : LlamaShape{};
  CAPTURE(shape.model_type, remat_name(remat));
  const int B = 2, T = 32;
  std::vector<std::int32_t> in(static_cast<std::size_t>(B * T)), tg(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    in[i] = static_cast<std::int32_t>(splitmix64(7 + i) % static_cast<std::uint64_t>(shape.vocab));
    tg[i] = static_cast<std::int32_t>(splitmix64(9000 + i) % static_cast<std::uint64_t>(shape.vocab));
  }
  auto params = perturbed_initial_params(shape, 5);

  device::DeviceOptions ho;
  ho.budget_bytes = LlamaPass::device_bytes(shape, B, T, remat) + (1 << 20);
  auto host_dev = device::Device::create(ho);
  LlamaPass host_pass(shape, B, T, remat, *host_dev);
  ArrayAccess host_access(params);
  const double want = host_pass.train(host_access, in.data(), tg.data(), B, T, 1.0f);
  const auto want_grads = host_access.all_grads();

  Gpu g;
  const std::uint64_t used_before = g.dev->memory_stats().used_bytes;
  std::vector<std::vector<std::vector<float>>> runs;
  for (int run = 0; run < 2; ++run) {
    LlamaPass pass(shape, B, T, remat, *g.dev);
    if (run == 0) {
      // The budget accounting is what the pass allocates, scratch included, up to the rounding
      // of its three allocations (activations, the GPT kernels' scratch, the Llama's).
      const std::uint64_t used = g.dev->memory_stats().used_bytes - used_before;
      CHECK(used >= LlamaPass::device_bytes(shape, B, T, remat, true));
      CHECK(used <= LlamaPass::device_bytes(shape, B, T, remat, true) + 3 * (std::uint64_t{2} << 20));
    }
    DeviceArrayAccess access(*g.dev, pass.kernels().gpt(), params);
    const double got = pass.train(access, in.data(), tg.data(), B, T, 1.0f);
    CHECK(got == Approx(want).epsilon(1e-5));
    runs.push_back(access.all_grads());
    if (run == 0) {
      // Forward only: the loss, and the last position's logits for generation.
      CHECK(pass.loss(access, in.data(), tg.data(), B, T) == Approx(want).epsilon(1e-5));
      std::vector<float> host_logits(static_cast<std::size_t>(B) * shape.vocab), logits(host_logits.size());
      host_pass.last_logits(host_access, in.data(), B, T, host_logits.data());
      pass.last_logits(access, in.data(), B, T, logits.data());
      check_normwise(logits, host_logits, kPass, "last position's logits");
    }
  }
  REQUIRE(runs[0].size() == want_grads.size());
  for (std::size_t i = 0; i < want_grads.size(); ++i) {
    INFO(want_grads[i].name);
    check_normwise(runs[0][i], want_grads[i].data, kPass, "gradient");
    check_bits(runs[1][i], runs[0][i], "the second GPU run's gradient");
  }
}

TEST_CASE("a Llama pass sizes its CUDA scratch into its device bytes", "[llama]") {
  const LlamaShape s;
  const int B = 2, T = 32;
  const std::uint64_t host = LlamaPass::device_bytes(s, B, T, Remat::never);
  const std::uint64_t cuda = LlamaPass::device_bytes(s, B, T, Remat::never, true);
  // At least the attention scores' gradient (B x heads x T x T floats) and the token ids.
  const std::uint64_t scores = static_cast<std::uint64_t>(B) * s.heads * T * T;
  CHECK(cuda - host >= scores * 4 + static_cast<std::uint64_t>(B) * T * 4);
  // Each block keeps the probabilities on CUDA where the host keeps row statistics.
  const std::uint64_t kept =
      static_cast<std::uint64_t>(s.layers) * 4 * (scores - llama::attention_state_floats(B, T, s.heads, s.head_dim));
  CHECK(cuda - host == llama_cuda_scratch_bytes(B * T, static_cast<std::size_t>(scores)) + kept);
}
