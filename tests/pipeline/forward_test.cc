// Forward-only passes through a pipeline's stages (pipeline/forward.h): stages as threads,
// after a training step, must hand every micro-batch's output with the bits of the layers
// run one after another on the same parameters: plain and interleaved schedules, P = 2 and
// 4, with and without a tied weight (the user's parameters lent from the owner's stage).
#include <catch2/catch.hpp>

#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

#include "pipeline/forward.h"
#include "pipeline/generators.h"
#include "pipeline/layers.h"
#include "pipeline/runner.h"
#include "tests/pipeline/common.h"

using namespace strata;
using namespace strata::pipeline;

namespace {

constexpr std::size_t kWidth = 12;
constexpr int kMicro = 4;
constexpr std::uint64_t kSeed = 9;

PipelineModel model_for(bool tie) {
  SyntheticModelSpec spec;
  spec.layers = 8;
  spec.width = kWidth;
  spec.rows = 3;
  spec.micro_batches = kMicro;
  spec.seed = 5;
  auto m = synthetic_model(spec);
  if (tie) {
    m.layers.back() = std::make_shared<TanhLinear>(kWidth, kWidth, false);  // a tie's user may not split
    m.tie = Tie{0, 0, 7, kWidth};                                           // its bias: layer 0's first row
  }
  return m;
}

// Micro-batch mb's output with every layer run in order on the stores' parameters.
std::vector<float> sequential(const PipelineModel& m, const std::map<int, const LocalParameterStore*>& holder, int mb) {
  std::vector<float> x(m.rows * m.layers.front()->in_features()), y, saved, work;
  m.input(100, mb, x.data());
  for (std::size_t id = 0; id < m.layers.size(); ++id) {
    const Layer& layer = *m.layers[id];
    std::vector<float> p = holder.at(static_cast<int>(id))->params_of(static_cast<int>(id));
    if (m.tie && static_cast<int>(id) == m.tie->user) {
      const auto& owner = holder.at(m.tie->owner)->params_of(m.tie->owner);
      p.insert(p.end(), owner.begin() + static_cast<std::ptrdiff_t>(m.tie->owner_offset),
               owner.begin() + static_cast<std::ptrdiff_t>(m.tie->owner_offset + m.tie->count));
    }
    y.resize(m.rows * layer.out_features());
    saved.resize(layer.saved_floats(m.rows));
    work.resize(layer.work_floats(m.rows));
    layer.forward(p.data(), x.data(), y.data(), saved.data(), work.data(), m.rows);
    std::swap(x, y);
  }
  return x;
}

}  // namespace

TEST_CASE("a forward-only pass through the stages gives the sequential forward's bits", "[pipeline]") {
  const bool tie = GENERATE(false, true);
  const Schedule s = GENERATE(one_f_one_b(2, kMicro), one_f_one_b(4, kMicro), interleaved_1f1b(2, kMicro, 2));
  INFO(s.kind << " p=" << s.stages << " v=" << s.chunks << (tie ? ", tied" : ""));
  const PipelineModel model = model_for(tie);
  auto stores = test::stage_stores(s, model, kSeed);
  for (auto& st : stores) st = std::make_unique<LocalParameterStore>(model, st->layers(), kSeed, 0.5f);  // SGD
  run_stages_as_threads(s, model, test::pointers(stores), {}, 1);  // the parameters move, the tie's messages pass
  std::map<int, const LocalParameterStore*> holder;
  for (const auto& st : stores)
    for (int id : st->layers()) holder[id] = st.get();

  LocalMailboxes boxes(std::chrono::milliseconds(20000));
  std::map<int, std::vector<float>> outputs;
  std::mutex mutex;
  std::exception_ptr failed;
  std::vector<std::thread> threads;
  for (int st = 0; st < s.stages; ++st) {
    threads.emplace_back([&, st] {
      try {
        LocalTransport transport(boxes, st);
        run_forward(
            s, st, model, *stores[static_cast<std::size_t>(st)], transport, kMicro,
            [&](int mb, float* x) { model.input(100, mb, x); },
            [&](int mb, const float* y) {
              std::lock_guard<std::mutex> lock(mutex);
              outputs[mb].assign(y, y + model.rows * model.layers.back()->out_features());
            });
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!failed) failed = std::current_exception();
        boxes.abort("a stage failed");
      }
    });
  }
  for (auto& t : threads) t.join();
  if (failed) std::rethrow_exception(failed);
  REQUIRE(outputs.size() == static_cast<std::size_t>(kMicro));
  for (int mb = 0; mb < kMicro; ++mb) {
    const auto want = sequential(model, holder, mb);
    REQUIRE(outputs[mb].size() == want.size());
    CHECK(std::memcmp(outputs[mb].data(), want.data(), want.size() * sizeof(float)) == 0);
    if (mb > 0) CHECK(outputs[mb] != outputs[mb - 1]);  // each micro-batch its own input
  }
  // The reference sees a change of parameters (so the comparison can fail).
  const auto before = sequential(model, holder, 0);
  stores.front()->optimizer_step();  // SGD on layer 0 with the step's gradient again
  CHECK(sequential(model, holder, 0) != before);
}
