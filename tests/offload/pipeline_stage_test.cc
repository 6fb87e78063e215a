// Pipeline stages on the ZeRO engine (engine/stage_store.h): P stages x D data-parallel
// replicas as P*D thread ranks, each stage's layers in an engine over that stage's
// data-parallel group, the executor gathering, reducing and stepping through it. After
// several steps the parameters must be the bits of one engine over the whole model running
// the plain loop with the same D ranks and micro-batches: every schedule, P = 2 and 4,
// D = 1 and 2, ZeRO stages 0-3, optimizer state and parameters on the device, in host RAM
// and on NVMe, fp32 and 16-bit compute (fp16 with a loss scaler that skips). Plus the
// configs the pipeline refuses, by name.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <regex>
#include <thread>

#include "engine/engine.h"
#include "engine/stage_store.h"
#include "pipeline/executor.h"
#include "pipeline/generators.h"
#include "pipeline/memory.h"
#include "pipeline/runner.h"
#include "pipeline/transport.h"
#include "runtime/core/error.h"
#include "runtime/device/arena.h"
#include "tests/engine/engine_support.h"
#include "tests/support/error_of.h"
#include "tests/support/ranks.h"
#include "tests/support/temp_dir.h"

using namespace strata;
using engine::OffloadDevice;
using pipeline::Schedule;

namespace {

constexpr int kLayers = 8, kMicro = 8, kSteps = 3;
constexpr std::uint64_t kInitSeed = 21;
constexpr float kClip = 0.05f;  // below the first steps' gradient norm: clipping changes the bits

// Replica d's model: the same layers, its own inputs and targets (its share of the batch).
pipeline::PipelineModel replica_model(int d) {
  pipeline::SyntheticModelSpec spec;
  spec.layers = kLayers;
  spec.width = 16;
  spec.rows = 4;
  spec.micro_batches = kMicro;
  spec.seed = 100 + static_cast<std::uint64_t>(d);
  spec.unsplittable_every = 3;  // layers 2 and 5 run their whole backward at B
  return pipeline::synthetic_model(spec);
}

struct Placement {
  int zero = 0;
  OffloadDevice opt = OffloadDevice::none, par = OffloadDevice::none;
  bool overlap = false;         // offload_optimizer.overlap_step: the optimistic step, undone on overflow or clipping
  bool clip = true;             // gradient_clipping kClip, else off
  DType compute = DType::fp32;  // fp16: with a dynamic loss scaler
};

const char* name(OffloadDevice d) {
  return d == OffloadDevice::none ? "device" : d == OffloadDevice::cpu ? "cpu" : "nvme";
}

engine::EngineConfig config_for(const Placement& p, int replicas, const std::string& nvme_dir) {
  auto c = test::mlp_config(p.zero, replicas, p.compute, 4, kMicro);
  c.fp16.loss_scale = 0;  // dynamic, from 2^16, halved by each overflow
  c.fp16.hysteresis = 1;
  c.gradient_clipping = p.clip ? kClip : 0.0f;
  c.zero.reduce_bucket_size = 300;                // one bucket a layer (272 parameters)
  c.zero.stage3_param_persistence_threshold = 0;  // stage 3 gathers every layer
  c.zero.sub_group_size = 100;
  c.offload_param.max_in_cpu = 0;
  c.offload_param.buffer_size = 200;
  c.offload_optimizer.device = p.opt;
  c.offload_param.device = p.par;
  c.offload_optimizer.nvme_path = nvme_dir;
  c.offload_param.nvme_path = nvme_dir;
  c.offload_optimizer.overlap_step = p.overlap;
  return c;
}

using Params = std::map<int, std::vector<float>>;  // by global layer id, replica 0's masters

// Splits an engine's full_parameters() into its layers (registration order).
void split_into(Params& out, const std::vector<int>& ids, const std::vector<float>& all) {
  const std::size_t n = all.size() / ids.size();  // every synthetic layer has the same size
  for (std::size_t i = 0; i < ids.size(); ++i) out[ids[i]].assign(all.begin() + i * n, all.begin() + (i + 1) * n);
}

// Runs body(rank) on n threads and rethrows the first failure. (No world communicator: a
// rank talks only to its stage's data-parallel group, made by group_comm.)
void run_threads(int n, const std::function<void(int)>& body) {
  std::vector<test::RankOutcome> outcomes(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (...) {
        outcomes[r].error = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  // The root cause first: a rank refused at setup makes its peers fail on the connection.
  for (const auto& o : outcomes) {
    if (!o.error) continue;
    try {
      std::rethrow_exception(o.error);
    } catch (const Error& e) {
      if (e.code() != Errc::comm && e.code() != Errc::timeout) throw;
    } catch (...) {
      throw;
    }
  }
  test::rethrow_first(outcomes);
}

// Group `group`'s Gloo communicator for D > 1 (null for one replica), rendezvous in `dir`.
std::unique_ptr<comm::Communicator> group_comm(const std::string& dir, int group, int rank, int size) {
  if (size == 1) return nullptr;
  comm::CommOptions g;
  g.rendezvous.rank = rank;
  g.rendezvous.world_size = size;
  g.rendezvous.path = dir;
  g.rendezvous.run_id = "group" + std::to_string(group);
  g.rendezvous.timeout = std::chrono::milliseconds(20000);
  return comm::Communicator::create(g);
}

using ModelOf = std::function<pipeline::PipelineModel(int replica)>;

// A gathered layer's values in fp32 (a 16-bit compute copy widened exactly).
std::vector<float> widened(const engine::TensorView& v) {
  std::vector<float> out(v.numel);
  convert(v.data, v.dtype, out.data(), DType::fp32, v.numel);
  return out;
}

// The plain data-parallel run: D ranks, one engine each over the whole model, driven
// through the engine's own calls (not StageStore, which it checks): per micro-batch a
// forward gathering each layer, the loss gradient (times the engine's loss scale), a
// backward writing each layer's dW into its gradient buffer (rounded to the compute dtype)
// and reducing it.
struct Plain {
  Params params;
  std::vector<double> clip_coefs;   // replica 0's, per step
  std::vector<bool> skipped;        // the same
  std::vector<double> loss_scales;  // the same
};
Plain run_plain(const Placement& p, int replicas, const std::string& dir, const ModelOf& model_of = replica_model) {
  Plain out;
  test::TempDir rendezvous("strata-rdzv");
  run_threads(replicas, [&](int d) {
    auto group = group_comm(rendezvous.path(), 0, d, replicas);
    const auto model = model_of(d);
    auto dev = test::host_device(64 << 20);
    engine::Engine e({.config = config_for(p, replicas, dir + "/plain"), .device = dev.get(), .comm = group.get()});
    std::vector<int> all(kLayers);
    for (int i = 0; i < kLayers; ++i) {
      all[i] = i;
      e.register_param("layer" + std::to_string(i), {static_cast<std::int64_t>(model.layers[i]->param_count())}, i);
    }
    e.setup();
    e.init_weights([&](const std::string& name, std::uint64_t elem, std::uint64_t n, float* dst) {
      const int id = std::stoi(name.substr(5));
      std::vector<float> v(model.layers[id]->param_count());
      model.layers[id]->init_params(v.data(), kInitSeed, id);
      std::memcpy(dst, v.data() + elem, n * 4);
    });
    const std::size_t rows = model.rows;
    device::CpuAccessScope cpu(*dev);
    for (int k = 0; k < kSteps; ++k) {
      e.begin_step();
      for (int mb = 0; mb < kMicro; ++mb) {
        std::vector<std::vector<float>> x(kLayers + 1), saved(kLayers);
        std::vector<float> work;
        x[0].resize(rows * model.layers[0]->in_features());
        model.input(0, mb, x[0].data());
        for (int l = 0; l < kLayers; ++l) {
          const auto& layer = *model.layers[l];
          x[l + 1].resize(rows * layer.out_features());
          saved[l].resize(layer.saved_floats(rows));
          work.resize(layer.work_floats(rows));
          layer.forward(widened(e.gather(l)[0]).data(), x[l].data(), x[l + 1].data(), saved[l].data(), work.data(),
                        rows);
          e.release(l);
        }
        std::vector<float> dy(x[kLayers].size());
        model.loss_grad(0, mb, x[kLayers].data(), dy.data(), e.loss_scale());
        for (int l = kLayers; l-- > 0;) {
          const auto& layer = *model.layers[l];
          const std::vector<float> wide = widened(e.gather(l)[0]);
          const float* params = wide.data();
          std::vector<float> dw_values(layer.param_count());
          float* dw = dw_values.data();
          std::vector<float> dx(rows * layer.in_features());
          work.resize(layer.work_floats(rows));
          if (layer.splits_backward()) {
            layer.backward_input(params, x[l].data(), saved[l].data(), dy.data(), dx.data(), work.data(), rows);
            layer.backward_weight(params, x[l].data(), saved[l].data(), dy.data(), dw, work.data(), rows);
          } else {
            layer.backward(params, x[l].data(), saved[l].data(), dy.data(), dx.data(), dw, work.data(), rows);
          }
          const auto g = e.grad_buffers(l)[0];
          convert(dw, DType::fp32, g.data, g.dtype, g.numel);
          e.reduce_grads(l);
          e.release(l);
          dy = std::move(dx);
        }
      }
      const auto r = e.step();
      if (d == 0) {
        out.clip_coefs.push_back(r.clip_coef);
        out.skipped.push_back(r.skipped);
        out.loss_scales.push_back(r.loss_scale);
      }
    }
    const auto params = e.full_parameters();
    e.synchronize();
    if (d == 0) split_into(out.params, all, params);
  });
  return out;
}

// The pipelined run: rank r is stage r / D, replica r % D; each replica's stages exchange
// activations through that replica's mailboxes.
// steps (if given) gets replica 0's StepResults: [stage][step].
Params run_pipelined(const Schedule& s, const Placement& p, int replicas, const std::string& dir,
                     const ModelOf& model_of = replica_model,
                     std::vector<std::vector<engine::StepResult>>* steps = nullptr,
                     std::uint64_t device_budget = 64 << 20) {
  Params out;
  if (steps != nullptr) steps->assign(static_cast<std::size_t>(s.stages), {});
  std::mutex mutex;
  std::vector<std::unique_ptr<pipeline::LocalMailboxes>> boxes;
  for (int d = 0; d < replicas; ++d)
    boxes.push_back(std::make_unique<pipeline::LocalMailboxes>(std::chrono::milliseconds(30000)));
  test::TempDir rendezvous("strata-rdzv");
  run_threads(s.stages * replicas, [&](int rank) {
    const int stage = rank / replicas, d = rank % replicas;
    try {
      auto group = group_comm(rendezvous.path(), stage, d, replicas);
      auto pipe = group_comm(rendezvous.path(), 100 + d, stage, s.stages);  // replica d's stages
      const auto model = model_of(d);
      auto dev = test::host_device(device_budget);
      const std::string stage_dir = dir + "/stage" + std::to_string(stage);
      std::filesystem::create_directories(stage_dir);
      engine::Engine e({.config = config_for(p, replicas, stage_dir),
                        .device = dev.get(),
                        .comm = group.get(),
                        .pipeline_comm = pipe.get()});
      const auto ids = pipeline::stage_layers(s, model, stage);
      engine::StageStore store(e, model, ids, s.stages);
      // The schedule's activations and a chunk's layers gathered at once, reserved for the executor.
      const auto activations =
          pipeline::stage_memory(s, stage, model, pipeline::Remat::never, device::Arena::kAlignment);
      store.setup(activations, kLayers / s.virtual_stages(), stage, kInitSeed);
      pipeline::LocalTransport transport(*boxes[d], stage);
      pipeline::ExecutorOptions xo;
      xo.shared_device = &store.activation_device();
      {
        pipeline::StageExecutor exec(s, stage, model, store, transport, xo);
        for (int k = 0; k < kSteps; ++k) {
          exec.run_step();
          if (steps != nullptr && d == 0) (*steps)[static_cast<std::size_t>(stage)].push_back(store.last_step());
        }
      }
      const auto params = e.full_parameters();
      e.synchronize();
      if (d == 0) {
        std::lock_guard<std::mutex> lock(mutex);
        split_into(out, ids, params);
      }
    } catch (const std::exception& e) {
      boxes[d]->abort(str_cat("stage ", stage, " of replica ", d, " failed: ", e.what()));
      throw;
    }
  });
  return out;
}

std::vector<Schedule> schedules(int stages) {
  pipeline::AutoOptions a;
  a.stages = stages;
  a.micro_batches = kMicro;
  a.costs = pipeline::Costs::uniform(1, 1, 1);
  return {pipeline::gpipe(stages, kMicro),
          pipeline::one_f_one_b(stages, kMicro),
          pipeline::interleaved_1f1b(stages, kMicro, 2),
          pipeline::zb_h1(stages, kMicro),
          pipeline::zb_h2(stages, kMicro),
          pipeline::zb_auto(a)};
}

// "" when every layer's bits match, else the first difference.
std::string compare(const Params& got, const Params& want) {
  if (got.size() != want.size()) return str_cat(got.size(), " layers, want ", want.size());
  for (const auto& [id, w] : want) {
    const auto& g = got.at(id);
    if (g.size() != w.size()) return str_cat("layer ", id, ": ", g.size(), " values, want ", w.size());
    for (std::size_t i = 0; i < w.size(); ++i) {
      if (std::memcmp(&g[i], &w[i], 4) != 0) return str_cat("layer ", id, "[", i, "]: ", g[i], ", want ", w[i]);
    }
  }
  return "";
}

// Each schedule (all of them when `kinds` is empty) at each P and D against the plain run.
void check_schedules(const Placement& p, const std::string& dir, const std::vector<int>& replica_counts,
                     const std::vector<int>& stage_counts, const std::vector<std::string>& kinds = {}) {
  for (int replicas : replica_counts) {
    const Plain plain = run_plain(p, replicas, dir);
    const Params& want = plain.params;
    REQUIRE(want.size() == static_cast<std::size_t>(kLayers));
    REQUIRE(*std::min_element(plain.clip_coefs.begin(), plain.clip_coefs.end()) < 1.0);  // some step clipped
    const auto model = replica_model(0);
    for (const auto& [id, values] : want) {  // every layer trained
      std::vector<float> init(values.size());
      model.layers[id]->init_params(init.data(), kInitSeed, id);
      REQUIRE(values != init);
    }
    std::size_t ran = 0;
    for (int stages : stage_counts) {
      for (const Schedule& s : schedules(stages)) {
        if (!kinds.empty() && std::find(kinds.begin(), kinds.end(), s.kind) == kinds.end()) continue;
        ++ran;
        INFO("ZeRO " << p.zero << ", optimizer on " << name(p.opt) << ", parameters on " << name(p.par) << ", "
                     << s.kind << ", P=" << stages << ", D=" << replicas);
        CHECK(compare(run_pipelined(s, p, replicas, dir), want) == "");
      }
    }
    CHECK(ran == stage_counts.size() * (kinds.empty() ? 6 : kinds.size()));
  }
}

}  // namespace

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
    CHECK(compare(run_pipelined(s, p, replicas, dir.path(), poisoned_model, &steps), plain.params) == "");
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
    CHECK(compare(run_pipelined(s, q, replicas, dir.path(), poisoned_model, &steps), plain.params) == "");
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
  const std::regex named(R"(at least [^(]*\((\d+) B\) with what the trainer holds)");
  // Below the activations alone: refused before the engine is asked.
  const auto tiny = test::error_of([&] { run_pipelined(s, p, 1, dir.path(), replica_model, nullptr, 4096); });
  CHECK_THAT(tiny, Catch::Contains("the schedule's activations need") && Catch::Contains("re-materialize"));
  // From the largest stage's activations, raise the budget to each refusal's minimum until
  // every stage fits.
  std::uint64_t budget = 0, minimum = 0;
  const auto model = replica_model(0);
  for (int st = 0; st < s.stages; ++st)
    budget = std::max(budget, pipeline::stage_memory(s, st, model, pipeline::Remat::never, 256).pool_bytes() + 256);
  for (int tries = 0; tries < 4 && minimum == 0; ++tries) {
    const auto what = test::error_of([&] { run_pipelined(s, p, 1, dir.path(), replica_model, nullptr, budget); });
    std::smatch m;
    // Every stage's setup passed, and the run: this is the minimum.
    if (what.empty()) {
      minimum = budget;
      break;
    }
    INFO(what);
    REQUIRE(std::regex_search(what, m, named));
    const std::uint64_t next = std::stoull(m[1]);
    REQUIRE(next > budget);
    budget = next;
  }
  REQUIRE(minimum > 0);
  const auto below = test::error_of([&] { run_pipelined(s, p, 1, dir.path(), replica_model, nullptr, budget - 256); });
  CHECK_THAT(below, Catch::Contains("too small") && Catch::Contains(std::to_string(budget) + " B"));
  const Plain plain = run_plain(p, 1, dir.path());
  CHECK(compare(run_pipelined(s, p, 1, dir.path(), replica_model, nullptr, budget), plain.params) == "");
}

TEST_CASE("a pipeline stage refuses an engine not linked to the other stages", "[offload][negative]") {
  const auto model = replica_model(0);
  auto dev = test::host_device(64 << 20);
  {
    engine::Engine e({.config = config_for({}, 1, ""), .device = dev.get()});
    const auto what = test::error_of([&] { engine::StageStore(e, model, {0, 1}, 2); });
    CHECK_THAT(what, Catch::Contains("2-stage pipeline") && Catch::Contains("EngineOptions::pipeline_comm") &&
                         Catch::Contains("overflow skip"));
    CHECK_NOTHROW(engine::StageStore(e, model, {2, 3}, 1));  // one stage: nothing to link
  }
}
