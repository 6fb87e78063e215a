// What the pipeline-stage tests share (see pipeline_stage_support.h).
#include "tests/engine/pipeline_stage_support.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <regex>
#include <thread>

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

namespace strata::test::pipe {

using engine::OffloadDevice;
using pipeline::Schedule;

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

namespace {

// Splits an engine's full_parameters() into its layers (registration order, each layer's
// stored parameters).
void split_into(Params& out, const pipeline::PipelineModel& model, const std::vector<int>& ids,
                const std::vector<float>& all) {
  std::size_t at = 0;
  for (int id : ids) {
    const std::size_t n = model.stored_params(id);
    out[id].assign(all.begin() + static_cast<std::ptrdiff_t>(at), all.begin() + static_cast<std::ptrdiff_t>(at + n));
    at += n;
  }
  STRATA_CHECK(at == all.size(), Errc::internal, "split ", at, " of ", all.size(), " parameters");
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

// A gathered layer's values in fp32 (a 16-bit compute copy widened exactly).
std::vector<float> widened(const engine::TensorView& v) {
  std::vector<float> out(v.numel);
  convert(v.data, v.dtype, out.data(), DType::fp32, v.numel);
  return out;
}

}  // namespace

Plain run_plain(const Placement& p, int replicas, const std::string& dir, const ModelOf& model_of) {
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
    if (d == 0) split_into(out.params, model, all, params);
  });
  return out;
}

namespace {

// PipelinedOptions::forward_outputs' pass on one stage; `out` on replica 0's last stage.
void forward(pipeline::StageExecutor& exec, engine::Engine& e, const pipeline::PipelineModel& trained,
             const pipeline::PipelineModel& pass, std::map<int, std::vector<float>>* out, std::mutex& mutex) {
  std::vector<float> full(trained.rows * trained.layers.front()->in_features());
  const std::size_t in = pass.rows * pass.layers.front()->in_features(),
                    width = pass.rows * pass.layers.back()->out_features();
  e.begin_eval();
  exec.forward_pass(
      kMicro,
      [&](int mb, float* x) {
        trained.input(kSteps, mb, full.data());
        std::copy(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(in), x);
      },
      [&](int mb, const float* y) {
        std::lock_guard<std::mutex> lock(mutex);
        if (out != nullptr) (*out)[mb].assign(y, y + width);
      },
      &pass);
  e.end_eval();
}

}  // namespace

Params run_pipelined(const Schedule& s, const Placement& p, int replicas, const std::string& dir,
                     const PipelinedOptions& o) {
  auto* const steps = o.steps;
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
      const auto model = o.model_of(d);
      device::DeviceOptions dopt;
      dopt.budget_bytes = o.device_budget;
      dopt.pinned_budget_bytes = 64 << 20;
      dopt.guard_memory = o.guard_memory;
      if (o.cuda) dopt.backend = device::Backend::cuda;
      auto dev = device::Device::create(dopt);
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
          pipeline::stage_memory(s, stage, model, pipeline::Remat::never, device::Arena::kAlignment, dev->backend());
      store.setup(activations, static_cast<int>(model.layers.size()) / s.virtual_stages(), stage, kInitSeed);
      pipeline::LocalTransport transport(*boxes[d], stage);
      pipeline::ExecutorOptions xo;
      xo.shared_device = &store.activation_device();
      xo.scratch_device = store.scratch_device();
      xo.compute_threads = o.compute_threads;
      {
        pipeline::StageExecutor exec(s, stage, model, store, transport, xo);
        for (int k = 0; k < kSteps; ++k) {
          exec.run_step();
          if (steps != nullptr && d == 0) (*steps)[static_cast<std::size_t>(stage)].push_back(store.last_step());
        }
        if (o.forward_outputs != nullptr)
          forward(exec, e, model, o.forward_model_of ? o.forward_model_of(d) : model,
                  stage == s.stages - 1 && d == 0 ? o.forward_outputs : nullptr, mutex);
      }
      const auto params = e.full_parameters();
      e.synchronize();
      if (d == 0) {
        std::lock_guard<std::mutex> lock(mutex);
        split_into(out, model, ids, params);
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

std::uint64_t named_minimum(const pipeline::Schedule& s, const Placement& p, const std::string& dir,
                            PipelinedOptions o) {
  const std::regex named(R"(at least [^(]*\((\d+) B\) with what the trainer holds)");
  const auto model = o.model_of(0);
  // A CUDA stage's engine also keeps its bound kernels' scratch before asking the engine.
  const auto backend = o.cuda ? device::Backend::cuda : device::Backend::host;
  const std::uint64_t bound = engine::StageStore::bound_bytes(model, backend);
  std::uint64_t budget = 0;
  for (int st = 0; st < s.stages; ++st) {
    budget = std::max(
        budget, pipeline::stage_memory(s, st, model, pipeline::Remat::never, 256, backend).pool_bytes() + bound + 256);
  }
  for (int tries = 0; tries < 4; ++tries) {
    o.device_budget = budget;
    const auto what = test::error_of([&] { run_pipelined(s, p, 1, dir, o); });
    if (what.empty()) return budget;  // every stage's setup passed, and the run
    INFO(what);
    std::smatch m;
    REQUIRE(std::regex_search(what, m, named));
    const std::uint64_t next = std::stoull(m[1]);
    REQUIRE(next > budget);
    budget = next;
  }
  FAIL("no budget in 4 tries: the last named " << budget << " B");
  return 0;
}

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

void check_schedules(const Placement& p, const std::string& dir, const std::vector<int>& replica_counts,
                     const std::vector<int>& stage_counts, const std::vector<std::string>& kinds) {
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

}  // namespace strata::test::pipe
