// The engine on a CUDA device ([cuda]: skipped with the reason where no GPU is present).
// The suite's MLP (stack_trainer.h) computes on the host and moves parameters and gradients
// through the GPU's stream; the engine keeps its state on the GPU, in host RAM or on NVMe,
// reduces gradients and runs AdamW on the GPU or the CPU. The invariants are the host
// device's: every stage and every placement gives the same bits. (The demo model's cuBLAS
// path against the host device is tests/models/mlp_engine_test.cc's.)
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>

#include "tests/engine/engine_support.h"
#include "tests/support/same_bits.h"

using namespace strata;

namespace {

test::TrainSpec cuda_spec(int stage, DType compute) {
  test::TrainSpec spec;
  spec.backend = device::Backend::cuda;
  spec.config = test::mlp_config(stage, 1, compute);
  return spec;
}

using test::same_bits;

}  // namespace

TEST_CASE("on a CUDA device stages 0-3 give bitwise-identical parameters", "[zero][cuda]") {
  const DType compute = GENERATE(DType::bf16, DType::fp32);
  CAPTURE(dtype_name(compute));
  const auto stage0 = test::train_mlp(cuda_spec(0, compute));
  REQUIRE(stage0.losses.size() == 10);
  CHECK(stage0.losses.back() < stage0.losses.front());
  for (int stage = 1; stage <= 3; ++stage) {
    INFO("stage " << stage);
    const auto run = test::train_mlp(cuda_spec(stage, compute));
    CHECK(same_bits(run.params, stage0.params));
    CHECK(run.losses == stage0.losses);
  }
  auto overlapped = cuda_spec(2, compute);
  overlapped.config.zero.overlap_comm = true;
  CHECK(same_bits(test::train_mlp(overlapped).params, stage0.params));
}

TEST_CASE("on a CUDA device optimizer state and parameter shards off the GPU change no bit", "[zero][cuda]") {
  const DType compute = GENERATE(DType::bf16, DType::fp32);
  CAPTURE(dtype_name(compute));
  const auto on_gpu = test::train_mlp(cuda_spec(3, compute));
  struct Case {
    const char* name;
    engine::OffloadDevice optimizer, params;
  };
  for (const Case c : {Case{"optimizer in host RAM", engine::OffloadDevice::cpu, engine::OffloadDevice::none},
                       Case{"parameter shards in host RAM", engine::OffloadDevice::none, engine::OffloadDevice::cpu},
                       Case{"both in host RAM", engine::OffloadDevice::cpu, engine::OffloadDevice::cpu}}) {
    for (bool pinned : {true, false}) {
      INFO(c.name << (pinned ? ", pinned" : ", pageable"));
      auto spec = cuda_spec(3, compute);
      spec.config.offload_optimizer.device = c.optimizer;
      spec.config.offload_optimizer.pin_memory = pinned;
      spec.config.offload_param.device = c.params;
      spec.config.offload_param.pin_memory = pinned;
      spec.config.zero.stage3_param_persistence_threshold = 0;
      const auto run = test::train_mlp(spec);
      CHECK(same_bits(run.params, on_gpu.params));
      const auto& dev_used = run.memory.device.kind_used;
      if (c.optimizer != engine::OffloadDevice::none) CHECK(dev_used[static_cast<int>(engine::Kind::optimizer)] == 0);
      if (c.params != engine::OffloadDevice::none) CHECK(dev_used[static_cast<int>(engine::Kind::params)] == 0);
      CHECK(run.io.back().h2d_bytes > 0);
    }
  }
  // Stage 1 with the optimizer in host RAM: the updated copies return through the staging.
  auto stage1 = cuda_spec(1, compute);
  stage1.config.offload_optimizer.device = engine::OffloadDevice::cpu;
  CHECK(same_bits(test::train_mlp(stage1).params, on_gpu.params));
}

TEST_CASE("the engine refuses what its CUDA path does not do, by name", "[zero][cuda]") {
  auto lion = cuda_spec(2, DType::bf16);
  lion.config.optimizer.type = engine::OptimizerType::lion;
  CHECK_THROWS_WITH(test::train_mlp(lion), Catch::Contains("Lion") && Catch::Contains("offload_optimizer.device"));
  lion.config.offload_optimizer.device = engine::OffloadDevice::cpu;  // the CPU Lion is fine
  CHECK_NOTHROW(test::train_mlp(lion));
  auto two = cuda_spec(2, DType::bf16);
  two.world = 2;
  two.config = test::mlp_config(2, 2, DType::bf16);
  CHECK_THROWS_WITH(test::train_mlp(two),
                    Catch::Contains("needs EngineOptions.device_comm") && Catch::Contains("NCCL"));
  two.device_comm = true;  // a Gloo communicator: it cannot reach GPU memory
  CHECK_THROWS_WITH(test::train_mlp(two), Catch::Contains("device_comm") && Catch::Contains("gloo"));
}

// The CUDA path's rule, checked without a GPU: on a host device whose memory only stream
// work may touch (guard_memory, memory protection keys), one-rank training in every stage,
// dtype, placement and optimizer runs, and gives the bits of the unguarded run. A CPU access
// to device memory anywhere in the engine would end the test with SIGSEGV.
TEST_CASE("the engine never touches device memory from the CPU (guarded host device)", "[zero][pku]") {
  struct Case {
    int stage;
    DType compute;
    engine::OffloadDevice optimizer, params;
    engine::OptimizerType type;
    bool overlap;
  };
  using OD = engine::OffloadDevice;
  using OT = engine::OptimizerType;
  std::vector<Case> cases;
  for (int stage = 0; stage <= 3; ++stage) {
    for (DType t : {DType::bf16, DType::fp32, DType::fp16})
      cases.push_back({stage, t, OD::none, OD::none, OT::adamw, false});
    cases.push_back({stage, DType::bf16, stage == 0 ? OD::none : OD::cpu, OD::none, OT::adamw, true});
  }
  for (OD opt : {OD::none, OD::cpu}) {
    for (DType t : {DType::bf16, DType::fp32}) cases.push_back({3, t, opt, OD::cpu, OT::adamw, false});
  }
  cases.push_back({0, DType::fp32, OD::cpu, OD::none, OT::adamw, false});  // stage 0's staged copies
  cases.push_back({2, DType::bf16, OD::none, OD::none, OT::lion, false});
  cases.push_back({3, DType::fp32, OD::none, OD::cpu, OT::adagrad, true});
  for (const auto& c : cases) {
    INFO("stage " << c.stage << " " << dtype_name(c.compute) << " optimizer " << static_cast<int>(c.optimizer)
                  << " params " << static_cast<int>(c.params) << " type " << static_cast<int>(c.type) << " overlap "
                  << c.overlap);
    test::TrainSpec spec;
    spec.steps = 4;
    spec.config = test::mlp_config(c.stage, 1, c.compute);
    spec.config.offload_optimizer.device = c.optimizer;
    spec.config.offload_param.device = c.params;
    spec.config.optimizer.type = c.type;
    spec.config.zero.overlap_comm = c.overlap;
    const auto plain = test::train_mlp(spec);
    spec.guard_memory = true;
    const auto guarded = test::train_mlp(spec);
    CHECK(same_bits(guarded.params, plain.params));
    CHECK(guarded.losses == plain.losses);
  }
}

// Several ranks under the same rule: device memory is reached only by stream work and the
// device communicator (NCCL on GPUs, a second Gloo communicator here, its threads created
// with access); the host communicator (Gloo) and the engine's own thread never touch it.
TEST_CASE("with device collectives several ranks never touch device memory from the CPU (guarded)", "[zero][pku]") {
  struct Case {
    int stage;
    engine::OffloadDevice optimizer, params;
    bool overlap;
  };
  using OD = engine::OffloadDevice;
  const Case cases[] = {{0, OD::none, OD::none, false}, {1, OD::none, OD::none, true}, {2, OD::none, OD::none, false},
                        {2, OD::cpu, OD::none, true},   {3, OD::none, OD::none, true}, {3, OD::cpu, OD::cpu, false},
                        {3, OD::none, OD::cpu, true},   {1, OD::cpu, OD::none, false}};
  for (const auto& c : cases) {
    INFO("stage " << c.stage << " optimizer " << static_cast<int>(c.optimizer) << " params "
                  << static_cast<int>(c.params) << " overlap " << c.overlap);
    test::TrainSpec spec;
    spec.world = 2;
    spec.steps = 3;
    spec.config = test::mlp_config(c.stage, 2, DType::bf16);
    spec.config.offload_optimizer.device = c.optimizer;
    spec.config.offload_param.device = c.params;
    spec.config.zero.overlap_comm = c.overlap;
    spec.config.zero.stage3_param_persistence_threshold = c.params == OD::none ? 100000 : 0;
    spec.device_comm = true;
    const auto plain = test::train_mlp(spec);
    spec.guard_memory = true;
    const auto guarded = test::train_mlp(spec);
    CHECK(same_bits(guarded.params, plain.params));
  }
}
