// The executor with threads as stages: gradients bitwise equal to a sequential loop over
// the micro-batches for every schedule and re-materialization mode, the ParameterStore
// hooks a ZeRO engine will use, measured peak activations, and failures that end cleanly.
#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <map>

#include "pipeline/generators.h"
#include "pipeline/layers.h"
#include "pipeline/runner.h"
#include "pipeline/simulate.h"
#include "runtime/core/error.h"
#include "tests/pipeline/common.h"

using namespace strata;
using namespace strata::pipeline;

namespace {

constexpr std::uint64_t kSeed = 7;

PipelineModel model_for(int layers, int micro_batches, int unsplittable_every = 3) {
  SyntheticModelSpec spec;
  spec.layers = layers;
  spec.width = 12;
  spec.rows = 3;
  spec.micro_batches = micro_batches;
  spec.seed = 11;
  spec.unsplittable_every = unsplittable_every;
  return synthetic_model(spec);
}

}  // namespace

TEST_CASE("pipelined gradients equal a sequential loop bit for bit, stages as threads", "[pipeline]") {
  const Schedule s =
      GENERATE(gpipe(4, 8), one_f_one_b(4, 8), one_f_one_b(3, 2), interleaved_1f1b(4, 8, 2), interleaved_1f1b(2, 4, 4),
               interleaved_1f1b(1, 3, 4), zb_h1(4, 8), zb_h2(4, 6), test::auto_schedule(4, 8), gpipe(1, 3));
  const Remat remat = GENERATE(Remat::never, Remat::always, Remat::except_last);
  INFO(s.kind << " p=" << s.stages << " m=" << s.micro_batches << " v=" << s.chunks << " remat=" << remat_name(remat));
  const PipelineModel model = model_for(8 * (s.stages == 3 ? 3 : 1), s.micro_batches);
  LocalParameterStore reference(
      model,
      [&] {
        std::vector<int> all(model.layers.size());
        for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
        return all;
      }(),
      kSeed);
  run_sequential(model, s.micro_batches, reference);
  auto stores = test::stage_stores(s, model, kSeed);
  ExecutorOptions o;
  o.remat = remat;
  const auto reports = run_stages_as_threads(s, model, test::pointers(stores), o);
  for (int st = 0; st < s.stages; ++st) {
    INFO("stage " << st);
    CHECK(test::compare_grads(*stores[st], reference) == "");
    for (int id : stores[st]->layers()) CHECK(stores[st]->ready_count(id) == 1);
    const int want = remat == Remat::never ? 0 : (remat == Remat::always ? s.micro_batches : s.micro_batches - 1);
    CHECK(reports[st].recomputed == want * s.chunks);
  }
  // The executor keeps the activations the simulator counts.
  const auto sim = simulate(s, Costs{});
  for (int st = 0; st < s.stages; ++st) CHECK(reports[st].peak_activations == sim.stats.peak_activations[st]);
}

TEST_CASE("re-materialization lowers the device memory a GPipe stage peaks at", "[pipeline]") {
  const Schedule s = gpipe(2, 8);
  const PipelineModel model = model_for(8, 8, 0);
  std::uint64_t peak[2] = {0, 0};
  int k = 0;
  for (Remat r : {Remat::never, Remat::always}) {
    auto stores = test::stage_stores(s, model, kSeed);
    ExecutorOptions o;
    o.remat = r;
    peak[k++] = run_stages_as_threads(s, model, test::pointers(stores), o)[0].peak_device_bytes;
  }
  INFO("never " << peak[0] << " B, always " << peak[1] << " B");
  CHECK(peak[1] * 2 < peak[0]);
}

namespace {

// Records the hook calls a ZeRO engine would see, and checks their protocol as it goes.
class RecordingStore final : public ParameterStore {
 public:
  RecordingStore(const PipelineModel& model, std::vector<int> layers) : inner_(model, layers, kSeed) {}
  void begin_step() override {
    inner_.begin_step();
    next_micro_.clear();
    ++steps;
  }
  void before_action(const Action& a, const std::vector<int>& layers) override {
    if (in_action_) errors += "nested before_action; ";
    in_action_ = true;
    gathered_ = layers;
    if (a.kind == ActionKind::backward_weight || a.kind == ActionKind::backward_full) ++weight_actions;
  }
  const float* parameters(int layer) override {
    check_gathered(layer, "parameters");
    return inner_.parameters(layer);
  }
  void add_gradient(int layer, int micro, const float* dw) override {
    check_gathered(layer, "add_gradient");
    if (micro != next_micro_[layer]++) errors += "add_gradient out of micro-batch order; ";
    inner_.add_gradient(layer, micro, dw);
  }
  void after_action(const Action&, const std::vector<int>& layers) override {
    if (!in_action_ || layers != gathered_) errors += "after_action without matching before_action; ";
    in_action_ = false;
    ++actions;
  }
  void gradients_ready(int layer) override {
    ++ready[layer];
    if (stepped) errors += "gradients_ready after optimizer_step; ";
  }
  void optimizer_step() override { stepped = true; }

  std::string errors;
  int actions = 0, weight_actions = 0, steps = 0;
  bool stepped = false;
  std::map<int, int> ready;

 private:
  void check_gathered(int layer, const char* what) {
    if (!in_action_ || std::find(gathered_.begin(), gathered_.end(), layer) == gathered_.end())
      errors += str_cat(what, "(", layer, ") outside its action's gather; ");
  }
  LocalParameterStore inner_;
  bool in_action_ = false;
  std::vector<int> gathered_;
  std::map<int, int> next_micro_;  // the micro-batch add_gradient must give next, by layer
};

}  // namespace

TEST_CASE("every compute action gathers and releases its layers through the ParameterStore hooks", "[pipeline]") {
  const Schedule s = GENERATE(zb_h1(3, 6), interleaved_1f1b(3, 6, 2));
  const PipelineModel model = model_for(6, s.micro_batches);
  std::vector<std::unique_ptr<RecordingStore>> stores;
  std::vector<ParameterStore*> ptrs;
  for (int st = 0; st < s.stages; ++st) {
    stores.push_back(std::make_unique<RecordingStore>(model, stage_layers(s, model, st)));
    ptrs.push_back(stores.back().get());
  }
  run_stages_as_threads(s, model, ptrs);
  for (int st = 0; st < s.stages; ++st) {
    const auto& r = *stores[st];
    INFO(s.kind << " stage " << st);
    CHECK(r.errors == "");
    CHECK(r.steps == 1);
    CHECK(r.stepped);
    CHECK(static_cast<std::size_t>(r.actions) == compute_order(s)[st].size());
    CHECK(r.ready.size() == stage_layers(s, model, st).size());
    for (const auto& [id, n] : r.ready) CHECK(n == 1);
  }
}

TEST_CASE("several steps in a row reuse the executor and match sequential SGD", "[pipeline]") {
  const Schedule s = zb_h1(2, 4);
  const PipelineModel model = model_for(4, 4);
  std::vector<int> all{0, 1, 2, 3};
  LocalParameterStore reference(model, all, kSeed, 0.5f);
  for (int k = 0; k < 3; ++k) {
    run_sequential(model, 4, reference);
    reference.optimizer_step();
  }
  std::vector<std::unique_ptr<LocalParameterStore>> stores;
  for (int st = 0; st < 2; ++st)
    stores.push_back(std::make_unique<LocalParameterStore>(model, stage_layers(s, model, st), kSeed, 0.5f));
  run_stages_as_threads(s, model, test::pointers(stores), {}, 3);
  for (int st = 0; st < 2; ++st) {
    for (int id : stores[st]->layers()) {
      CHECK(stores[st]->params_of(id) == reference.params_of(id));
      CHECK(stores[st]->grads_of(id) == reference.grads_of(id));
    }
  }
}

namespace {

class FailingLayer final : public Layer {
 public:
  std::string name() const override { return "failing"; }
  std::size_t in_features() const override { return 12; }
  std::size_t out_features() const override { return 12; }
  std::size_t param_count() const override { return 1; }
  void init_params(float* p, std::uint64_t, int) const override { p[0] = 1; }
  void forward(const float*, const float*, float*, float*, float*, std::size_t) const override {
    STRATA_THROW(Errc::internal, "layer exploded on purpose");
  }
  void backward_input(const float*, const float*, float*, const float*, float*, float*, std::size_t) const override {}
  void backward_weight(const float*, const float*, const float*, const float*, float*, float*,
                       std::size_t) const override {}
};

}  // namespace

TEST_CASE("a layer that throws fails the run with its message and no stage hangs", "[pipeline][negative]") {
  const Schedule s = one_f_one_b(4, 8);
  PipelineModel model = model_for(4, 8);
  model.layers[2] = std::make_shared<FailingLayer>();  // stage 2
  auto stores = test::stage_stores(s, model, kSeed);
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(run_stages_as_threads(s, model, test::pointers(stores)), Catch::Contains("exploded on purpose"));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
}

TEST_CASE("executor inputs that cannot work are clear errors", "[pipeline][negative]") {
  const Schedule s = one_f_one_b(4, 8);
  const PipelineModel six = model_for(6, 8);
  auto stores = test::stage_stores(one_f_one_b(2, 8), six, kSeed);
  std::vector<ParameterStore*> four(4, stores[0].get());
  CHECK_THROWS_WITH(run_stages_as_threads(s, six, four), Catch::Contains("6 layers do not split evenly into 4"));
  CHECK_THROWS_WITH(run_stages_as_threads(interleaved_1f1b(2, 4, 2), six, {four[0], four[1]}),
                    Catch::Contains("into 4 virtual stages"));
  CHECK_THROWS_WITH(run_stages_as_threads(s, model_for(4, 8), {four[0]}), Catch::Contains("1 parameter stores for 4"));
  CHECK_THROWS_WITH(parse_remat("sometimes"), Catch::Contains("except_last"));
  Schedule broken = s;
  broken.actions[1].erase(broken.actions[1].begin());  // drop a receive
  CHECK_THROWS_WITH(run_stages_as_threads(broken, model_for(4, 8), four), Catch::Contains("not valid"));
}

TEST_CASE("weight gradients that come out of micro-batch order still sum in order", "[pipeline]") {
  // GPipe as its paper draws it (backwards in reverse) and a ZB-H1 whose W's run backwards.
  const int p = 3, m = 5;
  std::vector<std::vector<Action>> reversed(p);
  for (auto& list : reversed) {
    for (int i = 0; i < m; ++i) list.push_back({ActionKind::forward, i, 0, -1});
    for (int i = m - 1; i >= 0; --i) list.push_back({ActionKind::backward_full, i, 0, -1});
  }
  auto zb = compute_order(zb_h1(p, m));
  for (auto& list : zb) {
    std::vector<Action> ws;
    for (const auto& a : list)
      if (a.kind == ActionKind::backward_weight) ws.push_back(a);
    std::erase_if(list, [](const Action& a) { return a.kind == ActionKind::backward_weight; });
    for (auto it = ws.rbegin(); it != ws.rend(); ++it) list.push_back(*it);
  }
  for (const Schedule& s :
       {add_communication("gpipe-reversed", p, m, 1, reversed), add_communication("zb-h1-w-reversed", p, m, 1, zb)}) {
    INFO(s.kind);
    const PipelineModel model = model_for(6, m);
    LocalParameterStore reference(model, {0, 1, 2, 3, 4, 5}, kSeed);
    run_sequential(model, m, reference);
    auto stores = test::stage_stores(s, model, kSeed);
    run_stages_as_threads(s, model, test::pointers(stores));
    for (int st = 0; st < p; ++st) CHECK(test::compare_grads(*stores[st], reference) == "");
  }
}
