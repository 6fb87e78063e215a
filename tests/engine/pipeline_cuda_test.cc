// Pipeline stages on a GPU: the GPT's layers bound to each stage's CUDA stream
// (PipelineModel::bind), every stage a CUDA device of its own budget on GPU 0. Every schedule
// must give one stage's bits (the same cuBLAS products and kernels in the same order, whatever
// the schedule), and the logits of a forward-only pass after the steps must be those bits too,
// and near the host device's. At the named minimum budget the stages still train, their
// kernels' scratch reserved. A model whose layers are host code is refused on a CUDA stage.
#include <catch2/catch.hpp>

#include <cmath>

#include "pipeline/generators.h"
#include "tests/engine/pipeline_stage_support.h"
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

TEST_CASE("a model of host-code layers is refused on a CUDA stage", "[offload][cuda]") {
  test::TempDir dir("strata-pipe");
  CHECK_THROWS_WITH(run_pipelined(pipeline::one_f_one_b(2, kMicro), Placement{1}, 1, dir.path(), {.cuda = true}),
                    Catch::Contains("binds its layers to the stage's stream"));
}
