// Edge cases shared by the optimizers: zero gradients, huge and tiny magnitudes, every short
// length and misalignment (the padded head/tail path must compute exactly what the vector
// body computes), and NaN/Inf gradients, which must skip the step and leave the state alone.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "optim/adagrad.h"
#include "optim/adam.h"
#include "optim/lion.h"
#include "optim/step_plan.h"
#include "tests/optim/check.h"

using namespace strata;
using namespace strata::test;

TEST_CASE("zero gradients change AdamW parameters only by the decoupled weight decay", "[optim][boundary]") {
  const float wd = GENERATE(0.0f, 0.1f);
  TestShard sh(100, {DType::fp32, DType::fp32, true, DType::bf16});
  std::mt19937 rng(5);
  sh.fill_params(rng);  // gradients, m and v are all zero
  TestShard before = sh;
  optim::AdamConfig cfg;
  cfg.weight_decay = wd;
  optim::adam_step(cfg, sh.args(1));
  const float decay = optim::detail::adam_scalars(cfg, 1, 1.0f).decay;
  for (std::size_t i = 0; i < sh.size(); ++i) {
    CHECK(sh.p(i) == static_cast<float>(before.p(i)) * decay);
    CHECK(sh.m(i) == 0.0);
    CHECK(sh.v(i) == 0.0);
    CHECK(sh.copy(i) == bf16_to_fp32(fp32_to_bf16(static_cast<float>(sh.p(i)))));
  }
}

TEST_CASE("huge and tiny values stay finite and match the reference", "[optim][boundary]") {
  // |g| up to 1e18 keeps g*g (1e36) inside fp32; 1e-30 makes g*g underflow to zero.
  const float mags[] = {1e18f, 1e-30f, 3e-39f /* subnormal */, 1.0f};
  const float params[] = {1e30f, -1e-30f, 0.0f, -2.5f};
  constexpr std::size_t n = 16 * 4 + 5;
  TestShard sh(n, {DType::fp32, DType::fp32, true, DType::fp16});
  for (std::size_t i = 0; i < n; ++i) {
    sh.set_p(i, params[i % 4]);
    sh.set_grad(i, (i % 2 ? -1.0f : 1.0f) * mags[(i / 4) % 4]);
  }
  optim::AdamConfig cfg;
  cfg.weight_decay = 0.01f;
  for (std::int64_t step = 1; step <= 5; ++step) {
    std::vector<RefElem> ref(n);
    for (std::size_t i = 0; i < n; ++i) {
      ref[i] = sh.elem(i);
      ref_adam(cfg, step, 1.0, sh.grad(i), ref[i]);
    }
    optim::adam_step(cfg, sh.args(step));
    Mismatches bad;
    // The fp16 copy of 1e30 is inf by IEEE overflow; check p, m, v only.
    for (std::size_t i = 0; i < n; ++i) {
      CHECK(std::isfinite(sh.p(i)));
      CHECK(std::isfinite(sh.m(i)));
      CHECK(std::isfinite(sh.v(i)));
      bad.check("p", i, sh.p(i), ref[i].p);
      bad.check("m", i, sh.m(i), ref[i].m);
      bad.check("v", i, sh.v(i), ref[i].v);
    }
    INFO("step " << step << ": " << bad.first);
    CHECK(bad.count == 0);
  }
}

namespace {

enum class Rule { adamw, lion, adagrad };

void step_rule(Rule r, const optim::StepArgs& a) {
  optim::AdamConfig adam;
  adam.weight_decay = 0.1f;
  optim::LionConfig lion;
  lion.weight_decay = 0.1f;
  optim::AdagradConfig adagrad;
  adagrad.weight_decay = 0.1f;
  switch (r) {
    case Rule::adamw:
      optim::adam_step(adam, a);
      break;
    case Rule::lion:
      optim::lion_step(lion, a);
      break;
    case Rule::adagrad:
      optim::adagrad_step(adagrad, a);
      break;
  }
}

}  // namespace

TEST_CASE("every length and misalignment gives each element exactly its one-element result", "[optim][boundary]") {
  const Rule rule = GENERATE(Rule::adamw, Rule::lion, Rule::adagrad);
  const DType grad = GENERATE(DType::fp32, DType::bf16);
  const DType state = GENERATE(DType::fp32, DType::bf16);
  CAPTURE(static_cast<int>(rule), dtype_name(grad), dtype_name(state));
  constexpr std::size_t kMax = 70, kOffsets = 18;
  const ShardSpec spec{grad, state, true, DType::bf16};
  TestShard base(kMax + kOffsets, spec);
  std::mt19937 rng(9);
  base.fill_params(rng);
  base.fill_grads(rng);
  for (std::size_t i = 0; i < base.size(); ++i) {
    base.set_m(i, static_cast<float>(base.grad(i)) * 0.5f);
    base.set_v(i, static_cast<float>(base.grad(i) * base.grad(i)));
  }
  // Expected: each element stepped alone (a one-element shard goes through the padded path).
  TestShard single = base;
  for (std::size_t i = 0; i < base.size(); ++i) {
    optim::StepArgs a = single.args(3);
    const std::size_t es = dtype_size(state), eg = dtype_size(grad);
    a.master += i;
    a.grad = static_cast<const unsigned char*>(a.grad) + i * eg;
    a.m = static_cast<unsigned char*>(a.m) + i * es;
    a.v = static_cast<unsigned char*>(a.v) + i * es;
    a.copy = static_cast<unsigned char*>(a.copy) + i * 2;
    a.n = 1;
    step_rule(rule, a);
  }
  std::size_t bad = 0;
  for (std::size_t off = 0; off < kOffsets; ++off) {
    for (std::size_t n = 0; n <= kMax; ++n) {
      TestShard sh = base;
      optim::StepArgs a = sh.args(3);
      const std::size_t es = dtype_size(state), eg = dtype_size(grad);
      a.master += off;
      a.grad = static_cast<const unsigned char*>(a.grad) + off * eg;
      a.m = static_cast<unsigned char*>(a.m) + off * es;
      a.v = static_cast<unsigned char*>(a.v) + off * es;
      a.copy = static_cast<unsigned char*>(a.copy) + off * 2;
      a.n = n;
      step_rule(rule, a);
      for (std::size_t i = 0; i < sh.size(); ++i) {
        const bool inside = i >= off && i < off + n;
        const TestShard& want = inside ? single : base;
        if (sh.p(i) != want.p(i) || sh.m(i) != want.m(i) || sh.v(i) != want.v(i) || sh.copy(i) != want.copy(i)) {
          ++bad;
          UNSCOPED_INFO("offset " << off << " n " << n << " element " << i);
        }
      }
    }
  }
  CHECK(bad == 0);
}

TEST_CASE("a NaN or Inf gradient skips the step and leaves master, state and copy untouched", "[optim][boundary]") {
  const DType grad = GENERATE(DType::fp32, DType::bf16, DType::fp16);
  const float poison = GENERATE(std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                                -std::numeric_limits<float>::infinity());
  constexpr std::size_t n = 5000;  // two norm blocks, the second one short
  const std::size_t where = GENERATE(std::size_t{0}, std::size_t{4095}, std::size_t{4999});
  CAPTURE(dtype_name(grad), poison, where);
  TestShard sh(n, {grad, DType::fp32, true, DType::bf16});
  std::mt19937 rng(13);
  sh.fill_params(rng);
  sh.fill_grads(rng);
  sh.set_grad(where, poison);
  const auto before = sh.snapshot();

  optim::LossScalerConfig lc;
  lc.hysteresis = 1;
  optim::LossScaler scaler(lc);
  const double scale_before = scaler.scale();
  const optim::GradNorm norm = optim::grad_norm_sq(sh.args(1).grad, grad, n);
  CHECK_FALSE(norm.finite);
  const optim::StepPlan plan = optim::plan_step(norm, scaler, 1.0);
  CHECK(plan.skip);
  if (!plan.skip) optim::adam_step({}, sh.args(1, plan.grad_scale));
  CHECK(sh.snapshot() == before);
  CHECK(scaler.scale() == scale_before / 2);
}
