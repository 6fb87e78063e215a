// Forward-only passes through a pipeline's stages (pipeline/forward.h,
// StageExecutor::forward_pass): stages as threads, after a training step of the same
// executors, must hand every micro-batch's output with the bits of the layers run one after
// another on the same parameters: plain and interleaved schedules, P = 2 and 4, with and
// without a tied weight (the user's parameters lent from the owner's stage), for the
// trained model's rows and for fewer (sampling's shorter sequences, in the same buffers).
#include <catch2/catch.hpp>

#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

#include "pipeline/executor.h"
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

PipelineModel model_for(bool tie, std::size_t rows = 3) {
  SyntheticModelSpec spec;
  spec.layers = 8;
  spec.width = kWidth;
  spec.rows = rows;
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
  const std::size_t rows = GENERATE(3, 2);  // 2: a pass at fewer rows than the steps'
  const Schedule s = GENERATE(one_f_one_b(2, kMicro), one_f_one_b(4, kMicro), interleaved_1f1b(2, kMicro, 2));
  INFO(s.kind << " p=" << s.stages << " v=" << s.chunks << (tie ? ", tied" : "") << ", " << rows << " rows");
  const PipelineModel model = model_for(tie), pass = model_for(tie, rows);
  auto stores = test::stage_stores(s, model, kSeed);
  for (auto& st : stores) st = std::make_unique<LocalParameterStore>(model, st->layers(), kSeed, 0.5f);  // SGD
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
        StageExecutor exec(s, st, model, *stores[static_cast<std::size_t>(st)], transport);
        exec.run_step();  // the parameters move, the tie's messages pass
        exec.forward_pass(
            kMicro, [&](int mb, float* x) { pass.input(100, mb, x); },
            [&](int mb, const float* y) {
              std::lock_guard<std::mutex> lock(mutex);
              outputs[mb].assign(y, y + pass.rows * pass.layers.back()->out_features());
            },
            &pass);
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
    const auto want = sequential(pass, holder, mb);
    REQUIRE(outputs[mb].size() == want.size());
    CHECK(std::memcmp(outputs[mb].data(), want.data(), want.size() * sizeof(float)) == 0);
    if (mb > 0) CHECK(outputs[mb] != outputs[mb - 1]);  // each micro-batch its own input
  }
  // The reference sees a change of parameters (so the comparison can fail).
  const auto before = sequential(pass, holder, 0);
  stores.front()->optimizer_step();  // SGD on layer 0 with the step's gradient again
  CHECK(sequential(pass, holder, 0) != before);
}

TEST_CASE("a forward-only pass refuses a model that does not fit the trained model's buffers", "[pipeline]") {
  const Schedule s = one_f_one_b(1, kMicro);
  const PipelineModel model = model_for(false), wider = model_for(false, 4);
  LocalParameterStore store(model, test::stage_stores(s, model, kSeed).front()->layers(), kSeed, 0.5f);
  LocalMailboxes boxes(std::chrono::milliseconds(1000));
  LocalTransport transport(boxes, 0);
  StageExecutor exec(s, 0, model, store, transport);
  CHECK_THROWS_WITH(exec.forward_pass(
                        1, [&](int, float*) {}, [&](int, const float*) {}, &wider),
                    Catch::Contains("does not run in the buffers of the trained model's 8 layers at 3 rows"));
}
