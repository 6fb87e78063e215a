// The roofline pass moves exactly the step's bytes and leaves every value as it was.
#include <catch2/catch.hpp>

#include <cstring>
#include <random>

#include "optim/roofline.h"
#include "tests/optim/shard.h"

using namespace strata;
using namespace strata::test;

TEST_CASE("the roofline pass leaves the buffers bit-identical and copies the master's upper half", "[optim]") {
  const optim::UpdateRule rule = GENERATE(optim::UpdateRule::adam, optim::UpdateRule::lion, optim::UpdateRule::adagrad);
  const DType grad = GENERATE(DType::fp32, DType::bf16);
  const DType state = GENERATE(DType::fp32, DType::bf16);
  constexpr std::size_t n = 70001;
  TestShard sh(n, {grad, state, true, DType::bf16});
  std::mt19937 rng(47);
  sh.fill_params(rng);
  sh.fill_grads(rng);
  for (std::size_t i = 0; i < n; ++i) {
    sh.set_m(i, static_cast<float>(sh.grad(i)));
    sh.set_v(i, static_cast<float>(sh.grad(i) * sh.grad(i)));
  }
  TestShard before = sh;
  optim::roofline_pass(rule, sh.args(1));
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float p = static_cast<float>(sh.p(i));
    std::uint32_t bits;
    std::memcpy(&bits, &p, 4);
    const float upper = bf16_to_fp32(static_cast<std::uint16_t>(bits >> 16));
    if (sh.p(i) != before.p(i) || sh.m(i) != before.m(i) || sh.v(i) != before.v(i) || sh.copy(i) != upper) ++bad;
  }
  CHECK(bad == 0);
}

TEST_CASE("bytes per parameter match the anchors' 28 and 30 for fp32 AdamW", "[optim]") {
  optim::StepArgs a;
  CHECK(optim::traffic_per_param(a, optim::state_use(optim::UpdateRule::adam)).total() == 28);
  float dummy = 0;
  a.copy = &dummy;
  const auto t = optim::traffic_per_param(a, optim::state_use(optim::UpdateRule::adam));
  CHECK(t.total() == 30);
  CHECK(t.read == 16);
  CHECK(t.written == 14);
  a.grad_dtype = DType::bf16;
  a.state_format = MomentFormat::bf16;
  CHECK(optim::traffic_per_param(a, optim::state_use(optim::UpdateRule::adam)).total() == 4 + 2 + 4 + 4 + 4 + 2);
  CHECK(optim::traffic_per_param(a, optim::state_use(optim::UpdateRule::lion)).total() == 4 + 2 + 2 + 4 + 2 + 2);
}
