// Per-parameter learning-rate multipliers (ParamSpec::lr_scale): the engine cuts each rank's
// update where the scale changes, wherever the shard and bucket boundaries fall, so every
// parameter steps exactly as AdamW would step it alone with lr x lr_scale (decoupled decay at
// the base rate), at every stage, on two ranks, with the optimizer state on the device or host.
// q8 moments, stepped a block of 16 at one rate, refuse a parameter with a rate of its own.
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/engine.h"
#include "optim/adam.h"
#include "runtime/device/device.h"
#include "tests/engine/engine_support.h"
#include "tests/support/ranks.h"

using namespace strata;

namespace {

struct Param {
  const char* name;
  std::int64_t numel;
  int layer;
  float lr_scale;
};
// Layer 0's three parameters meet bucket and shard boundaries inside them (buckets of 100).
const std::vector<Param> kParams = {{"a", 37, 0, 4.0f}, {"b", 150, 0, 1.0f}, {"c", 21, 0, 0.5f}, {"d", 64, 1, 1.0f}};

float grad_of(std::size_t i, float w) { return 0.25f * w + 0.001f * static_cast<float>(i % 7) - 0.003f; }

engine::EngineConfig config(int stage, bool host_optimizer) {
  auto c = test::mlp_config(stage, 2, DType::fp32, 1, 1);
  c.gradient_clipping = 0.0f;
  c.zero.reduce_bucket_size = 100;
  c.zero.stage3_param_persistence_threshold = 0;
  if (host_optimizer) c.offload_optimizer.device = engine::OffloadDevice::cpu;
  return c;
}

}  // namespace

TEST_CASE("lr_scale steps each parameter at its own rate across shard and bucket boundaries", "[zero]") {
  const int stage = GENERATE(0, 1, 2, 3);
  const bool host_optimizer = GENERATE(false, true);
  INFO("stage " << stage << (host_optimizer ? ", optimizer on host" : ", optimizer on device"));
  const auto c = config(stage, host_optimizer);
  std::vector<float> before, after;
  std::mutex m;
  test::run_thread_ranks(2, [&](comm::Communicator& comm) {
    auto dev = device::Device::create({});
    engine::EngineOptions o;
    o.config = c;
    o.device = dev.get();
    o.comm = &comm;
    o.seed = 3;
    engine::Engine e(o);
    for (const auto& p : kParams)
      e.register_param(p.name, {p.numel}, p.layer, {engine::InitKind::normal, 1.0f}, p.lr_scale);
    e.setup();
    const auto w0 = e.full_parameters();
    e.begin_step();
    for (int l = 0; l < 2; ++l) {
      const auto views = e.gather(l);
      const auto grads = e.grad_buffers(l);
      for (std::size_t t = 0; t < views.size(); ++t)
        for (std::size_t i = 0; i < views[t].numel; ++i) grads[t].as<float>()[i] = grad_of(i, views[t].as<float>()[i]);
      e.reduce_grads(l);
      e.release(l);
    }
    e.step();
    const auto w1 = e.full_parameters();
    if (comm.rank() == 0) {
      std::lock_guard<std::mutex> lock(m);
      before = w0;
      after = w1;
    }
  });
  REQUIRE(after.size() == before.size());
  std::size_t at = 0;
  for (const auto& p : kParams) {
    INFO("parameter " << p.name << " (lr_scale " << p.lr_scale << ")");
    const auto n = static_cast<std::size_t>(p.numel);
    const auto& oc = c.optimizer;
    auto adamw_alone = [&](float scale) {  // this parameter alone at lr x scale, decay at the base rate
      std::vector<float> w(before.begin() + static_cast<std::ptrdiff_t>(at),
                           before.begin() + static_cast<std::ptrdiff_t>(at + n));
      std::vector<float> g(n), mom(n, 0.0f), var(n, 0.0f);
      for (std::size_t i = 0; i < n; ++i) g[i] = grad_of(i, w[i]);
      optim::StepArgs a;
      a.master = w.data();
      a.grad = g.data();
      a.m = mom.data();
      a.v = var.data();
      a.n = n;
      optim::adam_step({oc.lr * scale, oc.beta1, oc.beta2, oc.eps, oc.weight_decay / scale, true, true}, a);
      return w;
    };
    CHECK(std::memcmp(adamw_alone(p.lr_scale).data(), after.data() + at, n * 4) == 0);
    // The scale matters: the step at the base rate differs wherever lr_scale is not 1.
    if (p.lr_scale != 1.0f) CHECK(std::memcmp(adamw_alone(1.0f).data(), after.data() + at, n * 4) != 0);
    at += n;
  }
}

TEST_CASE("an lr_scale that is not a finite positive number is refused naming the parameter", "[zero][negative]") {
  auto dev = device::Device::create({});
  engine::EngineOptions o;
  o.config = config(0, false);
  o.config.train_batch_size = 1;
  o.device = dev.get();
  engine::Engine e(o);
  CHECK_THROWS_WITH(e.register_param("w", {8}, 0, {}, 0.0f), Catch::Contains("register_param('w'): lr_scale 0"));
  CHECK_THROWS_WITH(e.register_param("w", {8}, 0, {}, -1.0f), Catch::Contains("must be finite and above 0"));
}

TEST_CASE("q8 moments refuse a parameter with its own learning rate, naming it", "[zero][q8]") {
  auto c = config(1, false);
  c.optimizer.moment_format = MomentFormat::q8;
  auto dev = device::Device::create({});
  engine::EngineOptions o;
  o.config = c;
  o.device = dev.get();
  engine::Engine e(o);
  e.register_param("plain", {32}, 0);  // lr_scale 1: a block's rate is the step's
  CHECK_THROWS_WITH(e.register_param("scaled", {32}, 0, {}, 0.5f),
                    Catch::Contains("register_param('scaled'): lr_scale 0.5 with q8 moments") &&
                        Catch::Contains("use bf16 or fp32 moments"));
}
