// The GPT's pipeline layers as stages on the ZeRO engine (engine/stage_store.h, driven as in
// tests/engine/pipeline_stage_test.cc): what the stage store reserves for bound kernels'
// scratch, the tied embedding under the guarded host device, and stages on a GPU: the GPT's
// layers bound to each stage's CUDA stream (PipelineModel::bind), every stage a CUDA device of
// its own budget on GPU 0. Every schedule must give one stage's bits (the same cuBLAS products
// and kernels in the same order, whatever the schedule), and the logits of a forward-only pass
// after the steps must be those bits too, and near the host device's. At the named minimum
// budget the stages still train, their kernels' scratch reserved.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>

#include "engine/stage_store.h"
#include "models/gpt/kernels.h"
#include "models/gpt/pipeline_layers.h"
#include "pipeline/generators.h"
#include "pipeline/memory.h"
#include "runtime/device/arena.h"
#include "tests/engine/pipeline_stage_support.h"
#include "tests/models/gpt_stage_support.h"
#include "tests/support/error_of.h"
#include "tests/support/temp_dir.h"

using namespace strata;
using namespace strata::test::pipe;
using engine::OffloadDevice;
using pipeline::Schedule;

namespace {

// sqrt(sum (a - b)^2 / sum b^2) over every micro-batch's logits.
double relative_error(const std::map<int, std::vector<float>>& a, const std::map<int, std::vector<float>>& b) {
  double num = 0, den = 0;
  for (const auto& [mb, want] : b) {
    const auto& got = a.at(mb);
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
      num += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
      den += static_cast<double>(want[i]) * want[i];
    }
  }
  return std::sqrt(num / den);
}

}  // namespace

TEST_CASE("a pipelined GPT on CUDA stages gives one stage's bits for every schedule", "[offload][cuda]") {
  test::TempDir dir("strata-pipe");
  const SmallGpt small = small_gpt(dir.path(), GENERATE(false, true));
  const ModelOf gpt = small.model_of(2);
  const Placement p = GENERATE(Placement{1}, Placement{3, OffloadDevice::cpu, OffloadDevice::none});
  INFO("ZeRO " << p.zero << ", optimizer on " << name(p.opt) << (small.config.unit_scaled ? ", unit-scaled" : ""));

  std::map<int, std::vector<float>> host_logits, one_logits;
  run_pipelined(pipeline::gpipe(1, kMicro), p, 1, dir.path(), {.model_of = gpt, .forward_outputs = &host_logits});
  const Params one = run_pipelined(pipeline::gpipe(1, kMicro), p, 1, dir.path(),
                                   {.model_of = gpt, .cuda = true, .forward_outputs = &one_logits});
  REQUIRE(one_logits.size() == static_cast<std::size_t>(kMicro));
  const double err = relative_error(one_logits, host_logits);
  INFO("logits on the GPU against the host device's: relative error " << err);
  CHECK(err < 1e-3);  // fp32 products on both (no TF32); Adam may step a near-zero gradient either way

  for (const Schedule& s :
       {pipeline::one_f_one_b(2, kMicro), pipeline::zb_h1(4, kMicro), pipeline::interleaved_1f1b(2, kMicro, 2)}) {
    INFO(s.kind << ", P=" << s.stages);
    std::map<int, std::vector<float>> logits;
    CHECK(compare(run_pipelined(s, p, 1, dir.path(), {.model_of = gpt, .cuda = true, .forward_outputs = &logits}),
                  one) == "");
    CHECK(logits == one_logits);
  }
}

// On a GPU each stage's bound kernels keep scratch of their own, which the stage's engine
// reserves beside the activations (PipelineModel::bind_bytes): at the named minimum budget,
// where nothing else is left, the stages still bind, train and pass forward to the bits of
// an ample budget; below it they are refused by name.
TEST_CASE("CUDA stages train at exactly the named minimum budget, their kernels' scratch counted", "[offload][cuda]") {
  test::TempDir dir("strata-pipe");
  const SmallGpt small = small_gpt(dir.path(), false);
  const Placement p{3, OffloadDevice::cpu, OffloadDevice::none};
  const Schedule s = pipeline::one_f_one_b(2, kMicro);
  std::map<int, std::vector<float>> ample_logits, tight_logits;
  const Params ample = run_pipelined(s, p, 1, dir.path(),
                                     {.model_of = small.model_of(2), .cuda = true, .forward_outputs = &ample_logits});
  const std::uint64_t budget =
      named_minimum(s, p, dir.path(), {.model_of = small.model_of(2), .cuda = true, .forward_outputs = &tight_logits});
  INFO("named minimum " << budget << " B");
  CHECK(
      compare(
          run_pipelined(
              s, p, 1, dir.path(),
              {.model_of = small.model_of(2), .device_budget = budget, .cuda = true, .forward_outputs = &tight_logits}),
          ample) == "");
  CHECK(tight_logits == ample_logits);
  const auto below = test::error_of([&] {
    run_pipelined(s, p, 1, dir.path(), {.model_of = small.model_of(2), .device_budget = budget - 256, .cuda = true});
  });
  CHECK_THAT(below, Catch::Contains("too small") && Catch::Contains(std::to_string(budget) + " B"));
}

// A CUDA stage's layers, bound to its stream, keep kernels with scratch of their own
// (PipelineModel::bind_bytes): the stage's engine reserves room for two binds (its layers'
// and a forward pass's) beside the activations, where the named minimum counts them; a
// host stage runs the layers unbound and reserves none, nor does a model without bind.
TEST_CASE("a CUDA stage reserves its bound kernels' scratch beside the activations; a host stage none", "[offload]") {
  test::TempDir dir("strata-pipe");
  const SmallGpt g = small_gpt(dir.path(), false);
  const auto gpt = g.model_of(2)(0);
  // Micro-batches of 2 sequences of 8 tokens: the CUDA kernels' token slots and scores.
  const int tokens = 2 * g.config.seq_len;
  const std::size_t scores = static_cast<std::size_t>(2 * g.config.shape.heads) * g.config.seq_len * g.config.seq_len;
  REQUIRE(gpt.bind_bytes == model::cuda_scratch_bytes(tokens, scores));
  REQUIRE(gpt.bind_bytes > 0);
  CHECK(engine::StageStore::bound_bytes(gpt, device::Backend::cuda) == 2 * device::Arena::round_up(gpt.bind_bytes));
  CHECK(engine::StageStore::bound_bytes(gpt, device::Backend::host) == 0);
  CHECK(engine::StageStore::bound_bytes(replica_model(0), device::Backend::cuda) == 0);  // host code: no bind
  const Schedule s = pipeline::one_f_one_b(2, kMicro);
  const auto ids = gpt.layers_of(0, 2);
  const auto replay = [&](device::Backend b) {
    return pipeline::stage_memory(s, 0, gpt, pipeline::Remat::never, device::Arena::kAlignment, b);
  };
  const auto reserved = [&](device::Backend b) {
    return engine::StageStore::reserved_bytes(replay(b), gpt, ids, static_cast<int>(ids.size()), DType::fp32, b);
  };
  CHECK(reserved(device::Backend::host) == replay(device::Backend::host).pool_bytes());
  CHECK(reserved(device::Backend::cuda) ==
        replay(device::Backend::cuda).pool_bytes() + 2 * device::Arena::round_up(gpt.bind_bytes));
  // What a block keeps between forward and backward: on the host the attention's row
  // statistics and output (B x T x (NH + C)), on CUDA its [B,NH,T,T] probabilities, which the
  // CUDA stage's pool is counted from; the embedding and the head keep the same on both.
  const std::size_t B = 2, T = static_cast<std::size_t>(g.config.seq_len),
                    NH = static_cast<std::size_t>(g.config.shape.heads),
                    C = static_cast<std::size_t>(g.config.shape.d_model);
  for (int id = 0; id < static_cast<int>(gpt.layers.size()); ++id) {
    const bool block = id >= 1 && id <= g.config.shape.layers;
    INFO("layer " << id);
    CHECK(gpt.saved_floats(id, device::Backend::host) ==
          gpt.layers[static_cast<std::size_t>(id)]->saved_floats(gpt.rows));
    CHECK(gpt.saved_floats(id, device::Backend::cuda) + (block ? B * T * (NH + C) : 0) ==
          gpt.saved_floats(id, device::Backend::host) + (block ? B * NH * T * T : 0));
  }
  CHECK(replay(device::Backend::cuda).peak_by_size != replay(device::Backend::host).peak_by_size);
}

// The GPT, whose LM head reads the token embedding (a tied weight across stages): the tied
// store's buffers are device memory it fills with copies and stream work. Guarded runs give
// the unguarded runs' bits (which tests/models/gpt_pipeline_test.cc holds to the
// sequential loop's), plain and unit-scaled, fp32 and bf16, with the ends on two stages and
// (one stage, interleaved) on one; so does a forward-only pass after the steps (validation,
// and sampling's shorter rows in the trained model's buffers), whose logits cross to the
// host through the executor's staging buffer.
TEST_CASE("a pipelined GPT and its tied embedding never touch device memory from the CPU (guarded)", "[offload][pku]") {
  test::TempDir dir("strata-pipe");
  const SmallGpt small = small_gpt(dir.path(), GENERATE(false, true));
  const model::GptConfig& c = small.config;
  const auto& batcher = small.batcher;
  const ModelOf gpt = small.model_of(2);
  for (const Schedule& s : {pipeline::one_f_one_b(2, kMicro), pipeline::zb_h1(4, kMicro),
                            pipeline::interleaved_1f1b(2, kMicro, 2), pipeline::gpipe(1, kMicro)}) {
    for (DType compute : {DType::fp32, DType::bf16}) {
      Placement p{3, OffloadDevice::cpu, OffloadDevice::none};
      p.compute = compute;
      INFO(s.kind << ", P=" << s.stages << ", " << dtype_name(compute) << (c.unit_scaled ? ", unit-scaled" : ""));
      // After the steps, a forward-only pass: at the trained rows in fp32, at fewer (2 sequences
      // of 5 tokens, as sampling's shorter rows) in bf16.
      const ModelOf pass = [&](int) {
        return model::gpt_pipeline_model(c, 2, kMicro, batcher, 0, 1, model::ops::Products::fp32, 5).model;
      };
      std::map<int, std::vector<float>> want, got;
      PipelinedOptions o{.model_of = gpt, .forward_outputs = &want};
      if (compute == DType::bf16) o.forward_model_of = pass;
      const Params plain = run_pipelined(s, p, 1, dir.path(), o);
      o.guard_memory = true;
      o.forward_outputs = &got;
      o.compute_threads = s.stages == 2 ? 2 : 0;  // a stage's own threads: ignored where guarded
      CHECK(compare(run_pipelined(s, p, 1, dir.path(), o), plain) == "");
      REQUIRE(want.size() == static_cast<std::size_t>(kMicro));
      CHECK(want.begin()->second.size() == (compute == DType::bf16 ? 10u : 16u) * 256u);  // rows x vocabulary
      CHECK(got == want);
    }
  }
}
