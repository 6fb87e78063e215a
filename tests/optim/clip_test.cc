// Global-norm clipping and the step plan: the PyTorch/DeepSpeed coefficient, folding it with
// the loss scale into one grad_scale, and that folding it into the optimizer's read equals
// clipping the gradient first.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <random>

#include "optim/adam.h"
#include "optim/clip.h"
#include "optim/step_plan.h"
#include "tests/optim/shard.h"

using namespace strata;
using namespace strata::test;

TEST_CASE("the clip coefficient is max_norm / (norm + 1e-6) above max_norm and 1 otherwise", "[optim]") {
  CHECK(optim::clip_coefficient(0.5, 1.0) == 1.0);
  CHECK(optim::clip_coefficient(1.0, 1.0) == 1.0);
  CHECK(optim::clip_coefficient(4.0, 1.0) == 1.0 / (4.0 + 1e-6));
  CHECK(optim::clip_coefficient(4.0, 0.0) == 1.0);  // gradient_clipping: 0 is off
  CHECK(optim::clip_coefficient(std::numeric_limits<double>::infinity(), 1.0) == 1.0);
}

TEST_CASE("a step plan unscales the norm, clips it and folds both into grad_scale", "[optim]") {
  optim::LossScaler scaler;  // 2^16
  const double s = scaler.scale();
  optim::GradNorm norm{9.0 * s * s, true};  // scaled norm 3 * s, true norm 3
  const auto plan = optim::plan_step(norm, scaler, 1.0);
  CHECK_FALSE(plan.skip);
  CHECK(plan.loss_scale == s);
  CHECK(plan.grad_norm == 3.0);
  CHECK(plan.clip_coef == 1.0 / (3.0 + 1e-6));
  CHECK(plan.grad_scale == static_cast<float>(plan.clip_coef / s));
  CHECK(scaler.state().iteration == 1);

  optim::GradNorm small{0.25 * s * s, true};
  const auto unclipped = optim::plan_step(small, scaler, 1.0);
  CHECK(unclipped.clip_coef == 1.0);
  CHECK(unclipped.grad_scale == static_cast<float>(1.0 / s));
}

TEST_CASE("folding the clip coefficient into grad_scale equals clipping the gradient first", "[optim]") {
  TestShard folded(2049, {DType::fp32, DType::fp32, true, DType::bf16});
  std::mt19937 rng(29);
  folded.fill_params(rng);
  folded.fill_grads(rng);
  TestShard clipped = folded;
  const float coef = static_cast<float>(optim::clip_coefficient(7.5, 1.0));
  for (std::size_t i = 0; i < clipped.size(); ++i) clipped.set_grad(i, static_cast<float>(clipped.grad(i)) * coef);
  optim::adam_step({}, folded.args(1, coef));
  optim::adam_step({}, clipped.args(1, 1.0f));
  CHECK(folded.snapshot() == clipped.snapshot());
}
