// Lion and Adagrad against the double-precision reference, step by step over many steps for
// every dtype mix, plus their parameter groups.
#include <catch2/catch.hpp>

#include <random>
#include <vector>

#include "optim/adagrad.h"
#include "optim/lion.h"
#include "tests/optim/check.h"

using namespace strata;
using namespace strata::test;

TEST_CASE("Lion matches the double reference at every one of 150 steps for every dtype mix", "[optim]") {
  const DType grad = GENERATE(DType::fp32, DType::bf16, DType::fp16);
  const DType state = GENERATE(DType::fp32, DType::bf16);
  const int copy = GENERATE(0, 1, 2);
  const float wd = GENERATE(0.0f, 0.2f);
  CAPTURE(dtype_name(grad), dtype_name(state), copy, wd);
  constexpr std::size_t n = 777;
  TestShard sh(n, {grad, state, copy != 0, copy == 2 ? DType::fp16 : DType::bf16});
  std::mt19937 rng(17);
  sh.fill_params(rng);
  optim::LionConfig cfg;
  cfg.lr = 1e-3f;
  cfg.weight_decay = wd;
  std::vector<RefElem> ref(n);
  for (std::int64_t step = 1; step <= 150; ++step) {
    sh.fill_grads(rng);
    const float scale = step % 4 == 0 ? 0.5f : 1.0f;
    for (std::size_t i = 0; i < n; ++i) {
      ref[i] = sh.elem(i);
      ref_lion(cfg, scale, sh.grad(i), ref[i]);
    }
    optim::lion_step(cfg, sh.args(step, scale));
    Mismatches bad;
    compare(sh, ref, {true, false}, bad);
    INFO("step " << step << ": " << bad.first);
    REQUIRE(bad.count == 0);
  }
}

TEST_CASE("Adagrad matches the double reference at every one of 150 steps for every dtype mix", "[optim]") {
  const DType grad = GENERATE(DType::fp32, DType::bf16, DType::fp16);
  const DType state = GENERATE(DType::fp32, DType::bf16);
  const int copy = GENERATE(0, 1, 2);
  const float wd = GENERATE(0.0f, 0.05f);
  const float lr_decay = GENERATE(0.0f, 0.01f);
  CAPTURE(dtype_name(grad), dtype_name(state), copy, wd, lr_decay);
  constexpr std::size_t n = 611;
  TestShard sh(n, {grad, state, copy != 0, copy == 2 ? DType::fp16 : DType::bf16});
  std::mt19937 rng(19);
  sh.fill_params(rng);
  optim::AdagradConfig cfg;
  cfg.weight_decay = wd;
  cfg.lr_decay = lr_decay;
  std::vector<RefElem> ref(n);
  for (std::int64_t step = 1; step <= 150; ++step) {
    sh.fill_grads(rng);
    for (std::size_t i = 0; i < n; ++i) {
      ref[i] = sh.elem(i);
      ref_adagrad(cfg, step, 1.0, sh.grad(i), ref[i]);
    }
    optim::adagrad_step(cfg, sh.args(step));
    Mismatches bad;
    compare(sh, ref, {false, true}, bad);
    INFO("step " << step << ": " << bad.first);
    REQUIRE(bad.count == 0);
  }
}

TEST_CASE("Lion and Adagrad parameter groups each apply their own hyperparameters", "[optim]") {
  TestShard a(129, {}), b(129, {});
  std::mt19937 rng(23);
  a.fill_params(rng);
  a.fill_grads(rng);
  b = a;
  optim::Lion lion;
  optim::LionConfig lc;
  lc.lr = 0.3f;
  lc.weight_decay = 0.5f;
  lion.step(a.args(1), lion.groups().add(lc));
  optim::lion_step(lc, b.args(1));
  CHECK(a.snapshot() == b.snapshot());

  optim::Adagrad adagrad;
  optim::AdagradConfig ac;
  ac.lr = 0.7f;
  ac.eps = 1e-3f;
  adagrad.step(a.args(2), adagrad.groups().add(ac));
  optim::adagrad_step(ac, b.args(2));
  CHECK(a.snapshot() == b.snapshot());
}
