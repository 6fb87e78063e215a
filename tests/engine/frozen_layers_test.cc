// Frozen layers (Engine::freeze_layer): a pretrained base under trainable layers, as LoRA
// fine-tuning has it. The demo MLP with some layers frozen keeps their values bit for bit,
// gives them no gradient or optimizer state (the ledger's optimizer and gradient bytes are
// the trainable layers' only), steps the trainable layers exactly as an all-trainable run
// steps them on the same gradients, trains bitwise alike at every stage and wherever state
// and parameter shards live, and resumes from a checkpoint that stores the frozen values
// without moments.
#include <catch2/catch.hpp>

#include <cstring>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "runtime/device/device.h"
#include "tests/engine/engine_support.h"
#include "tests/engine/param_offload_support.h"
#include "tests/support/temp_dir.h"

using namespace strata;

namespace {

using engine::OffloadDevice;

constexpr int kHidden = 32;
constexpr std::size_t kLayerElems = kHidden * kHidden + kHidden;  // weight and bias

// Layers [first_layer, last_layer] of the MLP are equal in a and b (full_parameters() order).
bool same_layers(const std::vector<float>& a, const std::vector<float>& b, int first_layer, int last_layer) {
  const std::size_t at = static_cast<std::size_t>(first_layer) * kLayerElems;
  const std::size_t n = static_cast<std::size_t>(last_layer - first_layer + 1) * kLayerElems;
  REQUIRE(a.size() >= at + n);
  REQUIRE(b.size() >= at + n);
  return std::memcmp(a.data() + at, b.data() + at, n * 4) == 0;
}

}  // namespace

TEST_CASE("trainable layers step as they would beside trainable ones, frozen layers keep every bit", "[frozen]") {
  const int world = GENERATE(1, 2);
  const int stage = GENERATE(0, 1, 2, 3);
  INFO("world " << world << ", stage " << stage);
  test::TrainSpec spec;
  spec.world = world;
  spec.steps = 1;  // one step: every layer's gradient comes from the same initial weights in both runs
  spec.read_initial = true;
  spec.config = test::mlp_config(stage, world, DType::bf16);
  spec.config.gradient_clipping = 0.0f;  // no global coupling between layers through the norm
  const auto all = test::train_mlp(spec);
  spec.frozen = {0, 1};
  const auto lora = test::train_mlp(spec);
  CHECK(lora.losses == all.losses);
  CHECK(same_layers(lora.params, lora.initial, 0, 1));  // frozen: untouched
  CHECK(!same_layers(all.params, all.initial, 0, 1));   // they would have moved
  CHECK(same_layers(lora.params, all.params, 2, 2));    // the trainable layer: the same update
  CHECK(!same_layers(lora.params, lora.initial, 2, 2));
}

TEST_CASE("frozen layers train bitwise alike at every stage and placement, with state for the trainable only",
          "[frozen][offload][uring]") {
  const int world = 2;
  test::TempDir dir("strata-frozen");
  test::TrainSpec spec;
  spec.world = world;
  spec.steps = 6;
  spec.read_initial = true;
  spec.frozen = {1};  // the middle layer: gradients flow through it to layer 0
  spec.config = test::stage3_config(world);
  const auto base = test::train_mlp(spec);
  REQUIRE(base.losses.back() < base.losses.front());
  CHECK(same_layers(base.params, base.initial, 1, 1));
  CHECK(!same_layers(base.params, base.initial, 0, 0));
  CHECK(base.placement.find("1 frozen layers hold none") != std::string::npos);
  // What the frozen layer does not hold: 12 B of optimizer state per element of its shard
  // (1056 elements padded to 1056 at world 2: 528 each), 4 B of accumulator.
  CHECK(base.placement.find("frozen layers: 1 (1056 parameters, held in the compute dtype only); not allocated: "
                            "6.19 KiB of optimizer state") != std::string::npos);
  auto trainable = spec;
  trainable.frozen.clear();
  const auto full = test::train_mlp(trainable);
  // Two of three equal layers keep optimizer state and gradient accumulators.
  CHECK(test::kind_bytes(base.memory, engine::Kind::optimizer) * 3 ==
        test::kind_bytes(full.memory, engine::Kind::optimizer) * 2);
  CHECK(test::kind_bytes(base.memory, engine::Kind::grads) * 3 ==
        test::kind_bytes(full.memory, engine::Kind::grads) * 2);

  struct Case {
    int stage;
    OffloadDevice opt, par;
  };
  const Case cases[] = {{0, OffloadDevice::none, OffloadDevice::none}, {1, OffloadDevice::cpu, OffloadDevice::none},
                        {2, OffloadDevice::nvme, OffloadDevice::none}, {3, OffloadDevice::cpu, OffloadDevice::nvme},
                        {3, OffloadDevice::nvme, OffloadDevice::nvme}, {3, OffloadDevice::none, OffloadDevice::cpu}};
  for (const auto& c : cases) {
    INFO("stage " << c.stage << ", optimizer " << static_cast<int>(c.opt) << ", parameters "
                  << static_cast<int>(c.par));
    auto s = spec;
    s.config = test::stage3_config(world);
    s.config.zero.stage = c.stage;
    test::place(s.config, c.opt, c.stage == 3 ? c.par : OffloadDevice::none, dir.path());
    const auto run = test::train_mlp(s);
    CHECK(run.losses == base.losses);
    CHECK(run.params == base.params);
  }
}

TEST_CASE("a checkpoint stores frozen layers' values without moments and resumes bitwise", "[frozen][offload][uring]") {
  test::TempDir dir("strata-frozen-ckpt");
  test::TrainSpec spec;
  spec.world = 2;
  spec.frozen = {0};
  spec.config = test::stage3_config(2);
  test::place(spec.config, OffloadDevice::nvme, OffloadDevice::nvme, dir.path() + "/swap");
  spec.steps = 6;
  const auto straight = test::train_mlp(spec);
  spec.steps = 3;
  spec.save_checkpoint = dir.path() + "/ckpt";
  const auto first = test::train_mlp(spec);
  const auto contents = test::checkpoint_contents(dir.path() + "/ckpt");
  CHECK(contents.count("layers.0.weight/master") == 1);
  CHECK(contents.count("layers.0.weight/exp_avg") == 0);
  CHECK(contents.count("layers.0.bias/exp_avg_sq") == 0);
  CHECK(contents.count("layers.1.weight/exp_avg") == 1);
  spec.save_checkpoint.clear();
  spec.load_checkpoint = dir.path() + "/ckpt";
  spec.first_step = 3;
  const auto resumed = test::train_mlp(spec);
  CHECK(resumed.params == straight.params);
  REQUIRE(first.losses.size() == 3);
  CHECK(std::vector<double>(straight.losses.begin() + 3, straight.losses.end()) == resumed.losses);
  // The same checkpoint trains every layer in a run that freezes none: layer 0's moments start at zero.
  spec.frozen.clear();
  const auto unfrozen = test::train_mlp(spec);
  CHECK(unfrozen.losses.front() == resumed.losses.front());
  CHECK(unfrozen.params != resumed.params);
}

TEST_CASE("a frozen layer refuses gradients and an unknown id is refused at setup", "[frozen][negative]") {
  auto dev = device::Device::create({});
  engine::EngineOptions o;
  o.config = test::mlp_config(0, 1, DType::fp32, 1, 1);
  o.device = dev.get();
  {
    engine::Engine e(o);
    e.register_param("w", {8}, 0);
    e.register_param("v", {8}, 1);
    e.freeze_layer(0);
    e.setup();
    CHECK_THROWS_WITH(e.freeze_layer(1), Catch::Contains("freeze_layer(1) after setup()"));
    e.begin_step();
    (void)e.gather(0);
    CHECK_THROWS_WITH(e.grad_buffers(0), Catch::Contains("layer 0 is frozen"));
    CHECK_THROWS_WITH(e.reduce_grads(0), Catch::Contains("layer 0 is frozen"));
    e.release(0);
    (void)e.grad_buffers(1);
    e.reduce_grads(1);
    const auto r = e.step();  // the frozen layer needs no reduction
    CHECK(r.step == 1);
  }
  engine::Engine e(o);
  e.register_param("w", {8}, 0);
  e.freeze_layer(5);
  CHECK_THROWS_WITH(e.setup(), Catch::Contains("freeze_layer(5): no parameter is registered under layer 5"));
}
