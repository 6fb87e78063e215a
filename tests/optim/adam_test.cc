// Adam/AdamW against the double-precision reference (reference.h): step by step over many
// steps for every dtype mix, free-running with accumulated bounds, and per-group settings.
#include <catch2/catch.hpp>

#include <random>
#include <vector>

#include "optim/adam.h"
#include "tests/optim/check.h"

using namespace strata;
using namespace strata::test;

namespace {

ShardSpec spec_of(DType grad, DType state, int copy) {
  return {grad, state, copy != 0, copy == 2 ? DType::fp16 : DType::bf16};
}

}  // namespace

TEST_CASE("AdamW and Adam match the double reference at every one of 200 steps for every dtype mix", "[optim]") {
  const DType grad = GENERATE(DType::fp32, DType::bf16, DType::fp16);
  const DType state = GENERATE(DType::fp32, DType::bf16);
  const int copy = GENERATE(0, 1, 2);  // none, bf16, fp16
  const bool adamw = GENERATE(true, false);
  const float wd = GENERATE(0.0f, 0.1f);
  CAPTURE(dtype_name(grad), dtype_name(state), copy, adamw, wd);
  constexpr std::size_t n = 1003;  // not a multiple of any vector width
  TestShard sh(n, spec_of(grad, state, copy));
  std::mt19937 rng(7);
  sh.fill_params(rng);
  optim::AdamConfig cfg;
  cfg.lr = 1e-2f;
  cfg.weight_decay = wd;
  cfg.adamw_mode = adamw;
  std::vector<RefElem> ref(n);
  for (std::int64_t step = 1; step <= 200; ++step) {
    sh.fill_grads(rng);
    const float scale = step % 3 == 0 ? 0.25f : 1.0f;
    for (std::size_t i = 0; i < n; ++i) {
      ref[i] = sh.elem(i);
      ref_adam(cfg, step, scale, sh.grad(i), ref[i]);
    }
    optim::adam_step(cfg, sh.args(step, scale));
    Mismatches bad;
    compare(sh, ref, {true, true}, bad);
    INFO("step " << step << ": " << bad.first);
    REQUIRE(bad.count == 0);
  }
}

TEST_CASE("AdamW with fp32 state stays within the accumulated bound of a free-running double run", "[optim]") {
  const DType grad = GENERATE(DType::fp32, DType::bf16);
  const bool bias_correction = GENERATE(true, false);
  CAPTURE(dtype_name(grad), bias_correction);
  constexpr std::size_t n = 517;
  TestShard sh(n, {grad, DType::fp32, true, DType::bf16});
  std::mt19937 rng(11);
  sh.fill_params(rng);
  optim::AdamConfig cfg;
  cfg.lr = 3e-3f;
  cfg.weight_decay = 0.05f;
  cfg.bias_correction = bias_correction;
  std::vector<RefElem> ref(n);
  for (std::size_t i = 0; i < n; ++i) ref[i] = sh.elem(i);
  for (std::int64_t step = 1; step <= 300; ++step) {
    sh.fill_grads(rng, 1e-4, 1e-1);
    for (std::size_t i = 0; i < n; ++i) ref_adam(cfg, step, 1.0, sh.grad(i), ref[i]);
    optim::adam_step(cfg, sh.args(step));
  }
  Mismatches bad;
  compare(sh, ref, {true, true}, bad);
  INFO(bad.first);
  CHECK(bad.count == 0);
}

TEST_CASE("AdamW parameter groups each apply their own hyperparameters", "[optim]") {
  optim::AdamConfig slow;
  slow.lr = 1e-4f;
  optim::AdamW opt(slow);
  optim::AdamConfig fast = slow;
  fast.lr = 1e-1f;
  fast.beta1 = 0.8f;
  fast.beta2 = 0.95f;
  fast.eps = 1e-6f;
  fast.weight_decay = 0.3f;
  const int g1 = opt.groups().add(fast);
  REQUIRE(g1 == 1);
  REQUIRE(opt.groups().size() == 2);
  TestShard a(301, {}), b(301, {});
  std::mt19937 rng(3);
  a.fill_params(rng);
  a.fill_grads(rng);
  b = a;
  opt.step(a.args(1), g1);
  optim::adam_step(fast, b.args(1));
  CHECK(a.snapshot() == b.snapshot());
  // A scheduler changes one group's lr between steps.
  fast.lr = 5e-2f;
  opt.groups().set(g1, fast);
  opt.step(a.args(2), g1);
  optim::adam_step(fast, b.args(2));
  CHECK(a.snapshot() == b.snapshot());
}
