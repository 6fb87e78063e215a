// Pipeline stages on ZeRO engines for `strata pipeline --config` (see pipeline_engine.h).
#include "train/pipeline_engine.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <thread>

#include "engine/engine.h"
#include "engine/memory_estimate.h"
#include "engine/stage_store.h"
#include "pipeline/memory.h"
#include "pipeline/runner.h"
#include "pipeline/transport.h"
#include "runtime/comm/communicator.h"
#include "runtime/core/error.h"
#include "runtime/core/trace.h"
#include "runtime/core/units.h"
#include "runtime/device/arena.h"
#include "runtime/device/device.h"
#include "train/stage_runner.h"

namespace strata::train {
namespace {

constexpr int kSummaryDoubles = 8;

struct RankOut {
  pipeline::StageReport report;
  StageSummary summary;
  std::vector<int> ids;
  std::vector<float> params;  // the stage's fp32 masters, its layers in id order
};

// One stage of one replica: its engine, store and executor, `steps` steps.
RankOut run_rank(const pipeline::Schedule& s, const pipeline::PipelineModel& model, const EngineStagesOptions& o,
                 int stage, comm::Communicator* group, comm::Communicator* pipe, pipeline::Transport& transport,
                 Tracer* tracer = nullptr) {
  RankOut out;
  StageRunner runner(s, model, o, stage, group, pipe, transport, tracer);
  for (int k = 0; k < o.steps; ++k) out.report = runner.step();
  out.ids = runner.layers();
  out.params = runner.parameters();
  if (tracer != nullptr) record_actions(*tracer, out.report);
  out.summary = runner.summary();
  return out;
}

// The plain data-parallel run of replica d: one engine over every layer, the plain loop.
std::vector<float> plain_params(const pipeline::PipelineModel& model, const EngineStagesOptions& o,
                                comm::Communicator* group) {
  auto dev = stage_device(o);
  const SubdirConfig cfg(o.config, "plain");
  engine::Engine e({.config = cfg.config, .device = dev.get(), .comm = group});
  std::vector<int> all(model.layers.size());
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
  engine::StageStore store(e, model, all, 1);
  e.setup();
  store.init(o.seed);
  for (int k = 0; k < o.steps; ++k) {
    pipeline::run_sequential(model, o.config.gradient_accumulation_steps, store, k);
    store.optimizer_step();
  }
  auto params = e.full_parameters();
  e.synchronize();
  return params;
}

// A stage's parameters against the plain run's (every layer, in id order), bit for bit.
bool matches(const pipeline::PipelineModel& model, const RankOut& mine, const std::vector<float>& plain) {
  std::vector<std::size_t> offset(model.layers.size() + 1, 0);
  for (std::size_t i = 0; i < model.layers.size(); ++i)
    offset[i + 1] = offset[i] + model.stored_params(static_cast<int>(i));
  if (plain.size() != offset.back()) return false;
  std::size_t at = 0;
  for (int id : mine.ids) {
    const std::size_t n = model.stored_params(id);
    if (at + n > mine.params.size() || std::memcmp(mine.params.data() + at, plain.data() + offset[id], n * 4) != 0)
      return false;
    at += n;
  }
  return at == mine.params.size();
}

void check_options(const pipeline::Schedule& s, const EngineStagesOptions& o) {
  STRATA_CHECK(o.replicas >= 1, Errc::invalid_argument, "--replicas ", o.replicas, " must be at least 1");
  STRATA_CHECK(o.config.gradient_accumulation_steps == s.micro_batches, Errc::invalid_argument,
               "the config's gradient_accumulation_steps is ", o.config.gradient_accumulation_steps,
               " but the schedule has ", s.micro_batches,
               " micro-batches (--micro): a step's micro-batches are the schedule's; make them equal");
}

EngineStagesResult run_threads(const pipeline::Schedule& s, const std::function<pipeline::PipelineModel(int)>& model_of,
                               const EngineStagesOptions& o) {
  const int P = s.stages, D = o.replicas;
  char dir_template[] = "/tmp/strata-pipeline-XXXXXX";
  STRATA_CHECK(::mkdtemp(dir_template) != nullptr, Errc::io, "cannot make a rendezvous directory under /tmp");
  const std::string dir = dir_template;
  comm::RendezvousConfig base;
  base.path = dir;
  base.run_id = "threads";
  std::vector<std::unique_ptr<pipeline::LocalMailboxes>> boxes;
  for (int d = 0; d < D; ++d) boxes.push_back(std::make_unique<pipeline::LocalMailboxes>());
  std::vector<RankOut> outs(static_cast<std::size_t>(P * D));
  std::vector<std::unique_ptr<Tracer>> tracers;  // replica 0's stages
  const auto origin = Tracer::Clock::now();
  for (int st = 0; st < P && !o.trace.empty(); ++st)
    tracers.push_back(std::make_unique<Tracer>(true, st, origin, "stage " + std::to_string(st)));
  std::vector<std::vector<float>> plain(static_cast<std::size_t>(D));
  std::exception_ptr first;
  std::mutex mutex;
  auto on_threads = [&](int n, const std::function<void(int)>& body) {
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        try {
          body(r);
        } catch (const std::exception& e) {
          {
            std::lock_guard<std::mutex> lock(mutex);
            if (!first) first = std::current_exception();
          }
          for (auto& b : boxes) b->abort(str_cat("rank ", r, " failed: ", e.what()));
        }
      });
    }
    for (auto& t : threads) t.join();
  };
  on_threads(P * D, [&](int r) {
    const int stage = r / D, d = r % D;
    auto group = sub_comm(base, "stage" + std::to_string(stage), d, D);
    auto pipe = sub_comm(base, "pipe" + std::to_string(d), stage, P);
    pipeline::LocalTransport transport(*boxes[d], stage);
    Tracer* tracer = d == 0 && !tracers.empty() ? tracers[stage].get() : nullptr;
    outs[r] = run_rank(s, model_of(d), o, stage, group.get(), pipe.get(), transport, tracer);
  });
  if (!first && o.verify) {
    on_threads(D, [&](int d) {
      auto group = sub_comm(base, "plain", d, D);
      plain[d] = plain_params(model_of(d), o, group.get());
    });
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (first) std::rethrow_exception(first);
  if (!tracers.empty()) {
    std::vector<const Tracer*> all;
    for (const auto& t : tracers) all.push_back(t.get());
    std::ofstream f(o.trace, std::ios::binary | std::ios::trunc);
    f << Tracer::merged_json(all);
    STRATA_CHECK(f.good(), Errc::io, "trace file '", o.trace, "' cannot be written: ", errno_text(errno));
  }
  EngineStagesResult res;
  const auto model = model_of(0);
  for (int r = 0; r < P * D; ++r) {
    if (o.verify) res.equal = res.equal && matches(model, outs[r], plain[r % D]);
    if (r % D == 0) {
      res.reports.push_back(outs[r].report);
      res.stages.push_back(outs[r].summary);
    }
  }
  return res;
}

EngineStagesResult run_ranks(const pipeline::Schedule& s, const std::function<pipeline::PipelineModel(int)>& model_of,
                             const EngineStagesOptions& o, const comm::RendezvousConfig& rdzv) {
  const int P = s.stages, D = o.replicas;
  comm::CommOptions wo;
  wo.rendezvous = rdzv;
  auto world = comm::Communicator::create(wo);
  STRATA_CHECK(world->world_size() == P * D, Errc::invalid_argument, "pipeline: ", P, " stages x ", D,
               " replicas need ", P * D, " ranks, not ", world->world_size(), " (strata launch -n ", P * D, ")");
  const int r = world->rank(), stage = r / D, d = r % D;
  auto group = sub_comm(rdzv, "stage" + std::to_string(stage), d, D);
  auto pipe = sub_comm(rdzv, "pipe" + std::to_string(d), stage, P);
  auto p2p = sub_comm(rdzv, "p2p" + std::to_string(d), stage, P);
  const auto model = model_of(d);
  RankOut mine;
  if (p2p) {
    pipeline::CommTransport transport(*p2p);
    mine = run_rank(s, model, o, stage, group.get(), pipe.get(), transport);
  } else {  // one stage: no messages
    pipeline::LocalMailboxes boxes;
    pipeline::LocalTransport transport(boxes, 0);
    mine = run_rank(s, model, o, stage, group.get(), pipe.get(), transport);
  }
  EngineStagesResult res;
  res.reporter = r == 0;
  if (d == 0) res.reports = p2p ? pipeline::gather_reports(*p2p, mine.report) : std::vector{mine.report};
  // Every field of StageSummary in its order (activations first: leaving it out shifted each
  // field by one and sent a word past the end).
  const std::vector<double> summary = {mine.summary.activations, mine.summary.device_peak, mine.summary.host_peak,
                                       mine.summary.nvme_used,   mine.summary.nvme_read,   mine.summary.nvme_write,
                                       mine.summary.grad_norm,   mine.summary.clip_coef};
  static_assert(sizeof(StageSummary) == kSummaryDoubles * sizeof(double), "a StageSummary field is not sent");
  std::vector<double> all(static_cast<std::size_t>(kSummaryDoubles * P * D));
  world->all_gather(summary.data(), all.data(), 2 * kSummaryDoubles, DType::fp32);  // doubles as fp32 word pairs
  for (int q = 0; q < P * D; q += D) {
    const double* v = all.data() + static_cast<std::size_t>(q) * kSummaryDoubles;
    res.stages.push_back({v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]});
  }
  if (o.verify) {
    std::size_t total = 0;
    for (std::size_t i = 0; i < model.layers.size(); ++i) total += model.stored_params(static_cast<int>(i));
    std::vector<float> plain(total);
    if (stage == 0) plain = plain_params(model, o, group.get());  // ranks 0..D-1: the plain run's D ranks
    world->broadcast(plain.data(), plain.size(), DType::fp32, 0);
    float differs = matches(model, mine, plain) ? 0.0f : 1.0f;
    world->all_reduce(&differs, 1, DType::fp32, comm::ReduceOp::max);
    res.equal = differs == 0.0f;
  }
  if (!res.reporter) res.reports.clear();
  return res;
}

}  // namespace

BudgetedSchedule zb_auto_within_budget(pipeline::AutoOptions a, const pipeline::PipelineModel& model,
                                       const EngineStagesOptions& o) {
  STRATA_CHECK(o.device_budget > 0, Errc::invalid_argument, "zb-auto within a device budget needs --device-budget");
  const int P = a.stages;
  // Each stage's engine minimum: its layers as StageStore registers them, gathered at once.
  std::vector<std::uint64_t> engine_min(static_cast<std::size_t>(P));
  for (int st = 0; st < P; ++st) {
    engine::EstimateInput in;
    in.config = o.config;
    in.world = o.replicas;
    in.device_budget = std::uint64_t{1} << 60;  // the minimum, not a fit: no budget to refuse
    const auto ids = model.layers_of(st, P);    // zb-auto: one chunk a stage
    in.layers_at_once = static_cast<int>(ids.size());
    in.params = engine::StageStore::param_specs(model, ids);
    engine_min[st] = engine::estimate_memory(in).device_minimum;
  }
  BudgetedSchedule best;
  for (int limit = 2 * P - 1; limit >= 1; --limit) {
    a.memory_limit = {static_cast<double>(limit)};
    pipeline::Schedule s = pipeline::zb_auto(a);
    std::uint64_t need = 0;
    for (int st = 0; st < P; ++st) {
      // What StageStore takes before the engine: the activations' pool and, at 16 bits, the
      // fp32 copies of the stage's layers (host-device stages bind no kernels).
      const auto ids = model.layers_of(st, P);
      const auto act = engine::StageStore::reserved_bytes(
          pipeline::stage_memory(s, st, model, o.executor.remat, device::Arena::kAlignment, device::Backend::host),
          model, ids, static_cast<int>(ids.size()), engine::compute_dtype_of(o.config), device::Backend::host);
      need = std::max(need, act + engine_min[st]);
    }
    best = {std::move(s), limit, need};
    if (need <= o.device_budget) return best;
  }
  STRATA_THROW(
      Errc::out_of_budget, "zb-auto under a device budget of ", format_bytes(o.device_budget),
      ": even a memory limit of 1 micro-batch needs ", format_bytes(best.need), " (", best.need,
      " B on its largest stage: the pool for the schedule's activations, the engine's minimum and, at 16 bits, "
      "the fp32 copies of the stage's layers); raise --device-budget "
      "to at least that, or re-materialize activations");
}

EngineStagesResult run_on_engines(const pipeline::Schedule& schedule,
                                  const std::function<pipeline::PipelineModel(int replica)>& model_of,
                                  const EngineStagesOptions& options) {
  check_options(schedule, options);
  const comm::RendezvousConfig rdzv = comm::rendezvous_from_env();
  if (!rdzv.path.empty() || rdzv.world_size > 1) return run_ranks(schedule, model_of, options, rdzv);
  return run_threads(schedule, model_of, options);
}

}  // namespace strata::train
