// Engine::abandon_step(): a trainer whose forward or backward failed midway drops the step,
// and the run goes on with the bits of a run in which the dropped step never began, at every
// stage, with gradient accumulation, overlapped reductions, stage-3 prefetch (the first
// trace's step dropped too) and the overlapped optimizer step (host and NVMe lanes that
// already updated a layer with the dropped step's gradients: an evaluation right after the
// abandon must not see that update; with the parameter shards on NVMe and one spare file, the
// second layer's write commits the first's early, and the abandon rebuilds it from the masters).
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/engine.h"
#include "runtime/core/error.h"
#include "tests/engine/engine_support.h"
#include "tests/support/temp_dir.h"

using namespace strata;

namespace {

constexpr int kLayers = 3;
constexpr int kElems = 40;

// One micro-batch's backward for a layer: dL/dw = w - target, added (the buffer starts zeroed).
void write_grads(engine::Engine& e, int layer, int mb, float garbage = 0.0f) {
  const auto params = e.gather(layer);
  const auto grads = e.grad_buffers(layer);
  const float* w = params[0].as<float>();
  float* g = grads[0].as<float>();
  for (int i = 0; i < kElems; ++i) {
    const float target = 0.01f * static_cast<float>((i + 3 * layer + mb) % 7);
    g[i] += garbage != 0.0f ? garbage : (w[i] - target) * e.loss_scale();
  }
}

void good_step(engine::Engine& e) {
  const auto accum = std::max<std::int64_t>(1, e.config().gradient_accumulation_steps);
  e.begin_step();
  for (int mb = 0; mb < accum; ++mb) {
    for (int l = 0; l < kLayers; ++l) {
      (void)e.gather(l);
      e.release(l);
    }
    for (int l = kLayers; l-- > 0;) {
      write_grads(e, l, mb);
      e.reduce_grads(l);
      e.release(l);
    }
  }
  (void)e.step();
}

enum class Failure { forward, backward, late_backward, eval };

// A step that fails midway: in the forward of layer 1 (layers 0 and 1 left gathered), or in
// the backward of layer 1 (layer 2's garbage gradient reduced and, at accumulation 1, handed to
// an overlapped optimizer; layer 1's garbage gradient written and never reduced), or in the
// backward of layer 0 (layers 2 and 1 reduced, and given the time to be stepped), or an
// evaluation failing in layer 1's forward. Every earlier micro-batch completed.
void failing_step(engine::Engine& e, Failure how) {
  const auto accum = std::max<std::int64_t>(1, e.config().gradient_accumulation_steps);
  if (how == Failure::eval) {
    e.begin_eval();
    (void)e.gather(0);
    (void)e.gather(1);
    e.abandon_step();
    return;
  }
  e.begin_step();
  for (int mb = 0; mb + 1 < accum; ++mb) {
    for (int l = 0; l < kLayers; ++l) {
      (void)e.gather(l);
      e.release(l);
    }
    for (int l = kLayers; l-- > 0;) {
      write_grads(e, l, mb, 0.5f);
      e.reduce_grads(l);
      e.release(l);
    }
  }
  (void)e.gather(0);
  if (how == Failure::forward) {
    (void)e.gather(1);
  } else {
    e.release(0);
    for (int l = 1; l < kLayers; ++l) {
      (void)e.gather(l);
      e.release(l);
    }
    write_grads(e, 2, 0, 0.5f);
    e.reduce_grads(2);
    e.release(2);
    write_grads(e, 1, 0, 0.5f);
    if (how == Failure::late_backward) {
      e.reduce_grads(1);
      e.release(1);
      write_grads(e, 0, 0, 0.5f);
      // An overlapped lane steps layers 2 and 1 within microseconds; this is ample time.
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  e.abandon_step();
}

struct Run {
  std::vector<float> params;
  std::uint64_t live_after_abandon = 0;
  std::vector<float> probed;  // what an evaluation gathered before step `probe_at`
};

// `steps` good steps; with `fail_before` >= 0 a failing step (then abandoned) comes first;
// before step `probe_at` an evaluation reads every layer's compute copy (an overlapped
// optimizer's update of the dropped step must not show there).
Run run(const engine::EngineConfig& c, int steps, int fail_before, Failure how, int probe_at) {
  auto dev = test::host_device(64 << 20);
  engine::EngineOptions o;
  o.config = c;
  o.device = dev.get();
  o.seed = 5;
  engine::Engine e(o);
  for (int l = 0; l < kLayers; ++l)
    e.register_param("w" + std::to_string(l), {kElems}, l, {engine::InitKind::normal, 0.1f});
  e.setup();
  Run r;
  e.abandon_step();  // outside a step: nothing to drop
  for (int s = 0; s < steps; ++s) {
    if (s == fail_before) {
      failing_step(e, how);
      r.live_after_abandon = e.memory().live_gathered_elems;
      e.abandon_step();  // twice: the second finds no step
    }
    if (s == probe_at) {
      e.begin_eval();
      for (int l = 0; l < kLayers; ++l) {
        const auto v = e.gather(l);
        r.probed.insert(r.probed.end(), v[0].as<float>(), v[0].as<float>() + kElems);
        e.release(l);
      }
      e.end_eval();
    }
    good_step(e);
  }
  r.params = e.full_parameters();
  return r;
}

}  // namespace

TEST_CASE("an abandoned step leaves the engine as if it had never begun", "[engine][abandon]") {
  test::TempDir dir("engine-abandon");
  struct Case {
    const char* name;
    engine::EngineConfig config;
  };
  std::vector<Case> cases;
  for (int stage : {0, 2, 3}) {
    auto c = test::mlp_config(stage, 1, DType::fp32, 1, 2);
    c.zero.stage3_param_persistence_threshold = 0;
    c.zero.overlap_comm = stage == 2;
    cases.push_back({stage == 0 ? "stage 0" : stage == 2 ? "stage 2, overlap_comm" : "stage 3, prefetch", c});
  }
  auto host_lane = test::mlp_config(2, 1, DType::fp32, 1, 1);
  host_lane.gradient_clipping = 0;  // the lane keeps its bet: it updates layer 2 before the failure
  host_lane.offload_optimizer.device = engine::OffloadDevice::cpu;
  host_lane.offload_optimizer.overlap_step = true;
  cases.push_back({"overlap_step, host optimizer", host_lane});
  auto nvme_lane = host_lane;
  nvme_lane.zero.stage = 3;
  nvme_lane.zero.stage3_param_persistence_threshold = 0;
  nvme_lane.offload_optimizer.device = engine::OffloadDevice::nvme;
  nvme_lane.offload_optimizer.nvme_path = dir.file("nvme");
  cases.push_back({"overlap_step, NVMe optimizer (the tail)", nvme_lane});
  auto nvme_shards = host_lane;
  nvme_shards.zero.stage = 3;
  nvme_shards.zero.stage3_param_persistence_threshold = 0;
  nvme_shards.offload_param.device = engine::OffloadDevice::nvme;
  nvme_shards.offload_param.nvme_path = dir.file("shards");
  nvme_shards.offload_param.spare_chunks = 1;  // three one-chunk shards, one spare
  cases.push_back({"overlap_step, host optimizer, NVMe shards with one spare", nvme_shards});

  for (const auto& k : cases) {
    for (int fail_before : {0, 1}) {  // 0: the stage-3 trace's first step is the dropped one
      const Run reference = run(k.config, 3, -1, Failure::forward, fail_before);
      for (Failure how : {Failure::forward, Failure::backward, Failure::late_backward, Failure::eval}) {
        INFO(k.name << ", failure before step " << fail_before << ", in "
                    << (how == Failure::forward         ? "forward"
                        : how == Failure::backward      ? "backward"
                        : how == Failure::late_backward ? "layer 0's backward"
                                                        : "evaluation"));
        const Run r = run(k.config, 3, fail_before, how, fail_before);
        CHECK(r.live_after_abandon == 0);
        CHECK(r.probed == reference.probed);
        REQUIRE(r.params.size() == reference.params.size());
        CHECK(std::memcmp(r.params.data(), reference.params.data(), r.params.size() * 4) == 0);
      }
    }
  }
}

TEST_CASE("without abandon_step a failed step blocks the next one", "[engine][abandon]") {
  // What abandon_step() is for: the protocol refuses a step that left a layer gathered.
  auto dev = test::host_device(64 << 20);
  engine::EngineOptions o;
  o.config = test::mlp_config(3, 1, DType::fp32, 1, 1);
  o.config.zero.stage3_param_persistence_threshold = 0;
  o.device = dev.get();
  engine::Engine e(o);
  for (int l = 0; l < kLayers; ++l) e.register_param("w" + std::to_string(l), {kElems}, l);
  e.setup();
  e.begin_step();
  (void)e.gather(0);
  CHECK_THROWS_WITH(e.begin_step(), Catch::Contains("begin_step() twice"));
  e.abandon_step();
  CHECK(e.memory().live_gathered_elems == 0);
  good_step(e);
  CHECK_THROWS_WITH(e.release(0), Catch::Contains("without a matching gather"));
}
