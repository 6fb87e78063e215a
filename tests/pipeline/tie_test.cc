// A weight two layers share (PipelineModel::tie, pipeline/tie.h), on synthetic layers: the
// last layer's bias is the first row of layer 0's weight. Stages as threads must end every
// schedule with the sequential loop's gradients and parameters bit for bit (the GPT's tie is
// held to its own pass in tests/models/gpt_pipeline_test.cc); a tie the pipeline cannot run
// is refused by name.
#include <catch2/catch.hpp>
#include <cstring>

#include "pipeline/generators.h"
#include "pipeline/layers.h"
#include "pipeline/runner.h"
#include "pipeline/tie.h"
#include "runtime/core/error.h"
#include "tests/pipeline/common.h"
#include "tests/support/error_of.h"
#include "tests/support/same_bits.h"

using namespace strata;
using namespace strata::pipeline;

namespace {

constexpr std::size_t kWidth = 12;

PipelineModel tied_model(int micro_batches, bool tie = true) {
  SyntheticModelSpec spec;
  spec.layers = 8;
  spec.width = kWidth;
  spec.rows = 3;
  spec.micro_batches = micro_batches;
  spec.seed = 5;
  auto m = synthetic_model(spec);
  m.layers.back() = std::make_shared<TanhLinear>(kWidth, kWidth, false);  // the user may not split
  if (tie) m.tie = Tie{0, 0, 7, kWidth};
  return m;
}

std::vector<int> all(const PipelineModel& m) {
  std::vector<int> v(m.layers.size());
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int>(i);
  return v;
}

using test::same_bits;

}  // namespace

TEST_CASE("a tied weight: pipelined stages match the sequential loop bit for bit, every schedule", "[pipeline]") {
  const Schedule s = GENERATE(gpipe(4, 8), one_f_one_b(2, 4), interleaved_1f1b(2, 4, 2), interleaved_1f1b(4, 4, 2),
                              zb_h1(4, 8), zb_h2(4, 6), test::auto_schedule(4, 8), gpipe(1, 3));
  INFO(s.kind << " p=" << s.stages << " m=" << s.micro_batches << " v=" << s.chunks);
  const auto model = tied_model(s.micro_batches);
  constexpr int kSteps = 2;
  LocalParameterStore reference(model, all(model), 9, 0.1f);
  for (int step = 0; step < kSteps; ++step) {
    run_sequential(model, s.micro_batches, reference, step);
    reference.optimizer_step();
  }
  std::vector<std::unique_ptr<LocalParameterStore>> stores;
  std::vector<ParameterStore*> ptrs;
  for (int st = 0; st < s.stages; ++st) {
    stores.push_back(std::make_unique<LocalParameterStore>(model, stage_layers(s, model, st), 9, 0.1f));
    ptrs.push_back(stores.back().get());
  }
  run_stages_as_threads(s, model, ptrs, {}, kSteps);
  for (const auto& st : stores) {
    for (int id : st->layers()) {
      INFO("layer " << id);
      CHECK(same_bits(st->params_of(id), reference.params_of(id)));
      CHECK(same_bits(st->grads_of(id), reference.grads_of(id)));
    }
  }
  CHECK(reference.params_of(7).size() == kWidth * kWidth);  // the user's store holds its weight alone
}

TEST_CASE("a tie the pipeline cannot run is refused by name", "[pipeline][negative]") {
  auto m = tied_model(4);
  m.tie->user = 0;
  CHECK_THAT(test::error_of([&] { m.check(1); }), Catch::Contains("two different layers"));
  m = tied_model(4);
  m.tie->count = 10000;
  CHECK_THAT(test::error_of([&] { m.check(1); }), Catch::Contains("does not fit layer 0"));
  m = tied_model(4);
  m.layers.back() = std::make_shared<TanhLinear>(kWidth, kWidth, true);
  CHECK_THAT(test::error_of([&] { m.check(1); }), Catch::Contains("must not split its backward"));
}
