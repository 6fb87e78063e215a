// Misuse is refused before any kernel runs, with a message naming the field.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "optim/adagrad.h"
#include "optim/adam.h"
#include "optim/lion.h"
#include "runtime/core/error.h"
#include "tests/optim/shard.h"

using namespace strata;
using namespace strata::test;
using Catch::Contains;

TEST_CASE("bad step arguments are refused by name", "[optim][negative]") {
  TestShard sh(64, {DType::fp32, DType::fp32, true, DType::bf16});
  const optim::AdamConfig c;
  auto with = [&](auto edit) {
    optim::StepArgs a = sh.args(1);
    edit(a);
    return a;
  };
  CHECK_THROWS_WITH(optim::adam_step(c, with([](auto& a) { a.master = nullptr; })), Contains("master is null"));
  CHECK_THROWS_WITH(optim::adam_step(c, with([](auto& a) { a.grad = nullptr; })), Contains("grad is null"));
  CHECK_THROWS_WITH(optim::adam_step(c, with([](auto& a) { a.v = nullptr; })), Contains("state v"));
  CHECK_THROWS_WITH(optim::adam_step(c, with([](auto& a) { a.grad_dtype = DType::fp8_e5m2; })),
                    Contains("grad dtype fp8_e5m2"));
  CHECK_THROWS_WITH(optim::adam_step(c, with([](auto& a) {
                                       a.state_format = MomentFormat::q8;
                                       a.n = 17;
                                     })),
                    Contains("whole blocks of 16"));
  CHECK_THROWS_WITH(optim::adam_step(c, with([](auto& a) { a.copy_dtype = DType::fp32; })),
                    Contains("copy dtype fp32"));
  CHECK_THROWS_WITH(optim::adam_step(c, with([](auto& a) { a.grad_scale = std::nanf(""); })), Contains("grad_scale"));
  CHECK_THROWS_WITH(optim::adam_step(c, with([](auto& a) { a.grad_scale = -1.0f; })), Contains("grad_scale"));
  CHECK_THROWS_WITH(optim::adam_step(c, with([](auto& a) { a.step = 0; })), Contains("step 0"));
  CHECK_THROWS_WITH(optim::adam_step(c, with([](auto& a) {
                                       a.master = reinterpret_cast<float*>(reinterpret_cast<char*>(a.master) + 1);
                                     })),
                    Contains("not aligned"));
  CHECK_THROWS_WITH(optim::adam_step(c, sh.args(1), optim::StepOptions{0}), Contains("block_elems"));
  // Lion needs only m, Adagrad only v; an empty shard needs no buffers at all.
  CHECK_NOTHROW(optim::lion_step({}, with([](auto& a) { a.v = nullptr; })));
  CHECK_NOTHROW(optim::adagrad_step({}, with([](auto& a) { a.m = nullptr; })));
  CHECK_NOTHROW(optim::adam_step(c, optim::StepArgs{}));
  // Nothing was written by the refused calls' kernels (they never started).
}

TEST_CASE("bad hyperparameters are refused by name", "[optim][negative]") {
  auto adam = [](auto edit) {
    optim::AdamConfig c;
    edit(c);
    return c;
  };
  CHECK_THROWS_WITH(optim::validate(adam([](auto& c) { c.beta1 = 1.0f; })), Contains("beta1"));
  CHECK_THROWS_WITH(optim::validate(adam([](auto& c) { c.beta2 = -0.1f; })), Contains("beta2"));
  CHECK_THROWS_WITH(optim::validate(adam([](auto& c) { c.eps = 0.0f; })), Contains("eps"));
  CHECK_THROWS_WITH(optim::validate(adam([](auto& c) { c.lr = std::numeric_limits<float>::infinity(); })),
                    Contains("lr"));
  CHECK_THROWS_WITH(optim::validate(adam([](auto& c) { c.weight_decay = -1.0f; })), Contains("weight_decay"));
  optim::LionConfig lion;
  lion.beta2 = 1.5f;
  CHECK_THROWS_WITH(optim::validate(lion), Contains("lion beta2"));
  optim::AdagradConfig adagrad;
  adagrad.lr_decay = -1.0f;
  CHECK_THROWS_WITH(optim::validate(adagrad), Contains("lr_decay"));
  optim::AdamW opt;
  CHECK_THROWS_WITH(opt.groups().get(3), Contains("parameter group 3"));
  CHECK_THROWS_WITH(opt.groups().add(adam([](auto& c) { c.eps = -1.0f; })), Contains("eps"));
  CHECK(opt.groups().size() == 1);
}
