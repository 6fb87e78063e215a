// Pipeline stages on the ZeRO engine (engine/stage_store.h): P stages x D data-parallel
// replicas as P*D thread ranks, each stage's layers in an engine over that stage's
// data-parallel group, the executor gathering, reducing and stepping through it. After
// several steps the parameters must be the bits of one engine over the whole model running
// the plain loop with the same D ranks and micro-batches: every schedule, P = 2 and 4,
// D = 1 and 2, ZeRO stages 0-3, optimizer state and parameters on the device, in host RAM
// and on NVMe, fp32 and 16-bit compute (fp16 with a loss scaler that skips). Plus the
// configs the pipeline refuses, by name.
#include <catch2/catch.hpp>

#include <atomic>
#include <limits>
#include <memory>

#include "engine/engine.h"
#include "engine/stage_store.h"
#include "pipeline/generators.h"
#include "pipeline/memory.h"
#include "runtime/core/error.h"
#include "runtime/device/arena.h"
#include "tests/engine/engine_support.h"
#include "tests/engine/pipeline_stage_support.h"
#include "tests/support/error_of.h"
#include "tests/support/temp_dir.h"

using namespace strata;
using namespace strata::test::pipe;
using engine::OffloadDevice;
using pipeline::Schedule;

// The sweeps: every schedule, P = 2 and 4, D = 1 and 2 (tagged [sweep]: ThreadSanitizer
// runs the small case below instead).
TEST_CASE("pipelined stages on the engine give the plain data-parallel run's bits at every ZeRO stage",
          "[offload][sweep]") {
  test::TempDir dir("strata-pipe");
  const int zero = GENERATE(0, 1, 2, 3);
  check_schedules({zero, OffloadDevice::none, OffloadDevice::none}, dir.path(), {1, 2}, {2, 4});
}

TEST_CASE("pipelined stages on the engine give the plain run's bits with state in host RAM", "[offload][sweep]") {
  test::TempDir dir("strata-pipe");
  const Placement p = GENERATE(Placement{2, OffloadDevice::cpu, OffloadDevice::none},
                               Placement{3, OffloadDevice::cpu, OffloadDevice::cpu});
  check_schedules(p, dir.path(), {1, 2}, {2, 4});
}

TEST_CASE("pipelined stages on the engine give the plain run's bits with state on NVMe", "[offload][uring][sweep]") {
  test::TempDir dir("strata-pipe");
  const Placement p = GENERATE(Placement{2, OffloadDevice::nvme, OffloadDevice::none},
                               Placement{3, OffloadDevice::nvme, OffloadDevice::nvme});
  check_schedules(p, dir.path(), {1, 2}, {2, 4});
}

// With overlap_step the host optimizer steps each layer during backward (in the stages'
// bubbles and W slots) and keeps it when the step does not clip.
TEST_CASE("two replicas of a two-stage zero-bubble pipeline on ZeRO-3 in host RAM match the plain run", "[offload]") {
  test::TempDir dir("strata-pipe");
  const bool overlap = GENERATE(false, true);
  INFO("overlap_step " << overlap);
  check_schedules({3, OffloadDevice::cpu, OffloadDevice::cpu, overlap}, dir.path(), {2}, {2}, {"zb-h1", "interleaved"});
}

namespace {

// A tanh layer whose weight gradient is +inf in one element on its n-th backward_weight
// call (counted per object, from 0): an overflow in one stage's gradients only.
class PoisonedLayer final : public pipeline::Layer {
 public:
  PoisonedLayer(std::shared_ptr<const pipeline::Layer> inner, int poisoned_call)
      : inner_(std::move(inner)), at_(poisoned_call) {}
  std::string name() const override { return "poisoned " + inner_->name(); }
  std::size_t in_features() const override { return inner_->in_features(); }
  std::size_t out_features() const override { return inner_->out_features(); }
  std::size_t param_count() const override { return inner_->param_count(); }
  void init_params(float* p, std::uint64_t seed, int index) const override { inner_->init_params(p, seed, index); }
  std::size_t saved_floats(std::size_t rows) const override { return inner_->saved_floats(rows); }
  std::size_t work_floats(std::size_t rows) const override { return inner_->work_floats(rows); }
  void forward(const float* p, const float* x, float* y, float* saved, float* work, std::size_t rows) const override {
    inner_->forward(p, x, y, saved, work, rows);
  }
  void backward_input(const float* p, const float* x, float* saved, const float* dy, float* dx, float* work,
                      std::size_t rows) const override {
    inner_->backward_input(p, x, saved, dy, dx, work, rows);
  }
  void backward_weight(const float* p, const float* x, const float* saved, const float* dy, float* dw, float* work,
                       std::size_t rows) const override {
    inner_->backward_weight(p, x, saved, dy, dw, work, rows);
    if (calls_++ == at_) dw[0] = std::numeric_limits<float>::infinity();
  }

 private:
  std::shared_ptr<const pipeline::Layer> inner_;
  int at_;
  mutable std::atomic<int> calls_{0};
};

// Replica d's model with layer 0 (stage 0's) overflowing in step 2's micro-batch 3.
pipeline::PipelineModel poisoned_model(int d) {
  auto m = replica_model(d);
  m.layers[0] = std::make_shared<PoisonedLayer>(m.layers[0], kMicro + 3);
  return m;
}

}  // namespace

// Post-validation: with offload_optimizer.overlap_step the last stage's optimizer (state on
// NVMe, or in host RAM) steps its layers during backward, betting on a step that neither
// overflows nor clips; stage 0's overflow reaches it only through the shared norm, and the
// step is undone.
TEST_CASE("an overflow in one stage undoes the other stages' optimistic step: bytes equal to the skip",
          "[offload][uring]") {
  test::TempDir dir("strata-pipe");
  const int replicas = GENERATE(1, 2);
  const OffloadDevice opt = GENERATE(OffloadDevice::nvme, OffloadDevice::cpu);
  INFO("optimizer state on " << name(opt));
  // No clipping: the lane's bet is lost only to the overflow.
  const Placement sync{3, opt, opt, false, false};
  Placement p = sync;
  p.overlap = true;
  const Plain plain = run_plain(sync, replicas, dir.path(), poisoned_model);
  REQUIRE(plain.skipped == std::vector<bool>{false, true, false});  // the plain run skips step 2
  const Plain clean = run_plain(sync, replicas, dir.path());
  REQUIRE(compare(plain.params, clean.params) != "");  // the skip changes the bytes
  for (const Schedule& s : {pipeline::zb_h1(2, kMicro), pipeline::zb_h2(2, kMicro)}) {
    INFO(s.kind << ", D=" << replicas);
    std::vector<std::vector<engine::StepResult>> steps;
    CHECK(compare(run_pipelined(s, p, replicas, dir.path(), {.model_of = poisoned_model, .steps = &steps}),
                  plain.params) == "");
    for (int st = 0; st < 2; ++st) {
      INFO("stage " << st);
      REQUIRE(steps[st].size() == static_cast<std::size_t>(kSteps));
      CHECK(!steps[st][0].skipped);
      CHECK(steps[st][1].skipped);
      CHECK(!steps[st][2].skipped);
    }
    // Stage 1's own gradients were finite: its lane stepped during backward and was undone.
    CHECK(steps[1][1].rolled_back);
  }
}

// 16-bit stages: each gathered layer is widened to fp32 for the layers and each gradient
// rounded to the compute dtype on its way in, as the plain loop does. Under fp16 the last
// stage's loss gradient carries the engine's loss scale; stage 0's overflow in step 2 makes
// every stage skip it and halve its scale alike, so step 3's loss gradient carries half the
// scale, and the run ends with the plain run's bits.
TEST_CASE("16-bit stages (fp16 with a dynamic loss scaler that skips, bf16) give the plain run's bits", "[offload]") {
  test::TempDir dir("strata-pipe");
  const DType compute = GENERATE(DType::fp16, DType::bf16);
  const Placement p = GENERATE(Placement{1, OffloadDevice::none, OffloadDevice::none},
                               Placement{3, OffloadDevice::cpu, OffloadDevice::cpu});
  const int replicas = GENERATE(1, 2);
  Placement q = p;
  q.compute = compute;
  const Plain plain = run_plain(q, replicas, dir.path(), poisoned_model);
  REQUIRE(plain.skipped == std::vector<bool>{false, true, false});
  if (compute == DType::fp16) REQUIRE(plain.loss_scales == std::vector<double>{65536, 65536, 32768});
  REQUIRE(compare(plain.params, run_plain(q, replicas, dir.path()).params) != "");  // the skip changes the bytes
  for (const Schedule& s : {pipeline::one_f_one_b(2, kMicro), pipeline::interleaved_1f1b(2, kMicro, 2),
                            pipeline::zb_h1(2, kMicro), pipeline::zb_h2(2, kMicro)}) {
    INFO(dtype_name(compute) << ", ZeRO " << q.zero << ", " << s.kind << ", D=" << replicas);
    std::vector<std::vector<engine::StepResult>> steps;
    CHECK(compare(run_pipelined(s, q, replicas, dir.path(), {.model_of = poisoned_model, .steps = &steps}),
                  plain.params) == "");
    for (const auto& stage : steps) {
      REQUIRE(stage.size() == plain.skipped.size());
      for (std::size_t k = 0; k < stage.size(); ++k) {
        CHECK(stage[k].skipped == plain.skipped[k]);
        CHECK(stage[k].loss_scale == plain.loss_scales[k]);
      }
    }
  }
}

// A device budget below what a stage needs (the pool for the schedule's replayed buffers,
// and the engine's minimum with a whole chunk gathered at once) is refused at setup, naming
// that minimum; a budget of exactly that trains to the plain run's bits: the activations'
// pool never fragments and the engine's buffers never interleave with it.
TEST_CASE("a stage's device budget is refused below the named minimum and trains at exactly it", "[offload]") {
  test::TempDir dir("strata-pipe");
  const Placement p{3, OffloadDevice::cpu, OffloadDevice::cpu};
  const Schedule s = GENERATE(pipeline::gpipe(2, kMicro), pipeline::one_f_one_b(2, kMicro), pipeline::zb_h1(2, kMicro),
                              pipeline::zb_h2(2, kMicro), pipeline::interleaved_1f1b(2, kMicro, 2));
  INFO(s.kind);
  // Below the activations alone: refused before the engine is asked.
  const auto tiny = test::error_of([&] { run_pipelined(s, p, 1, dir.path(), {.device_budget = 4096}); });
  CHECK_THAT(tiny, Catch::Contains("the schedule's activations need") && Catch::Contains("re-materialize"));
  const std::uint64_t budget = named_minimum(s, p, dir.path());
  const auto below = test::error_of([&] { run_pipelined(s, p, 1, dir.path(), {.device_budget = budget - 256}); });
  CHECK_THAT(below, Catch::Contains("too small") && Catch::Contains(std::to_string(budget) + " B"));
  const Plain plain = run_plain(p, 1, dir.path());
  CHECK(compare(run_pipelined(s, p, 1, dir.path(), {.device_budget = budget}), plain.params) == "");
}

TEST_CASE("a pipeline stage refuses an engine not linked to the other stages, and Muon", "[offload][negative]") {
  const auto model = replica_model(0);
  auto dev = test::host_device(64 << 20);
  {
    engine::Engine e({.config = config_for({}, 1, ""), .device = dev.get()});
    const auto what = test::error_of([&] { engine::StageStore(e, model, {0, 1}, 2); });
    CHECK_THAT(what, Catch::Contains("2-stage pipeline") && Catch::Contains("EngineOptions::pipeline_comm") &&
                         Catch::Contains("overflow skip"));
    CHECK_NOTHROW(engine::StageStore(e, model, {2, 3}, 1));  // one stage: nothing to link
  }
  {  // Muon picks hidden matrices by their layer's place in the engine, which a stage cannot see
    auto c = config_for({}, 1, "");
    c.optimizer.type = engine::OptimizerType::muon;
    c.zero.stage = 0;
    engine::Engine e({.config = c, .device = dev.get()});
    CHECK_THAT(test::error_of([&] {
                 engine::StageStore(e, model, {0, 1}, 2);
               }),
               Catch::Contains("\"Muon\" in a 2-stage pipeline"));
    CHECK_NOTHROW(engine::StageStore(e, model, {2, 3}, 1));
  }
}

// A stage on a GPU runs its layers on the stage's stream: a model whose layers are host code
// (the synthetic one) cannot, and is refused by name.
TEST_CASE("a model of host-code layers is refused on a CUDA stage", "[offload][cuda]") {
  test::TempDir dir("strata-pipe");
  CHECK_THROWS_WITH(run_pipelined(pipeline::one_f_one_b(2, kMicro), Placement{1}, 1, dir.path(), {.cuda = true}),
                    Catch::Contains("binds its layers to the stage's stream"));
}
