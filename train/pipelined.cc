// `strata train --pipeline-stages` (see pipelined.h).
#include "train/pipelined.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "engine/config.h"
#include "engine/engine.h"
#include "engine/stage_store.h"
#include "models/gpt/fp8_products.h"
#include "models/safetensors.h"
#include "pipeline/generators.h"
#include "pipeline/memory.h"
#include "pipeline/runner.h"
#include "runtime/core/error.h"
#include "runtime/core/trace.h"
#include "runtime/core/units.h"
#include "runtime/device/arena.h"
#include "train/checkpoints.h"
#include "train/output_check.h"
#include "train/pipelined_checkpoint.h"
#include "train/pipelined_model.h"
#include "train/pipelined_report.h"
#include "train/pipelined_sample.h"
#include "train/stage_runner.h"

namespace strata::train {
namespace {

// The FP8 scales after a step, as the plain trainer moves them: each operand's amax, the max
// over the stage's replicas (the plain trainer's over its ranks), enters its history. The
// sites of other stages' layers recorded nothing here, nor on the replicas: they stay unused.
void end_fp8_step(model::Fp8Products& fp8, comm::Communicator* group) {
  std::vector<float> amax = fp8.step_amax();
  if (group != nullptr && group->world_size() > 1)
    group->all_reduce(amax.data(), amax.size(), DType::fp32, comm::ReduceOp::max);
  fp8.end_step(amax);
}

struct Run {
  const PipelineTrainOptions& o;
  PipelinedModel model;
  int P = 1, D = 1, B = 1, m = 1;
  EngineStagesOptions eso;
  pipeline::Schedule first;  // zb-auto: ZB-H1 until the times are measured
  bool zb_auto = false;
  std::ofstream log;
  std::uint64_t tokens_per_step = 0;  // every replica's
  PipelineCheckpoints ckpt;
  // --trace: one per stage (threads, one origin) or this rank's alone (processes).
  std::vector<std::unique_ptr<Tracer>> tracers;

  // zb-auto from the per-stage times of the last step (every rank's, averaged over the
  // replicas), at the largest memory limit whose activations fit what each stage reserved.
  void go_auto(StageRunner& runner, const pipeline::PipelineModel& layers, const pipeline::StageReport& last, int stage,
               comm::Communicator* all, bool printer) const {
    const auto mine = pipeline::measured_costs(first, {last});
    const auto rows = gather_rows(
        all, {mine.forward[static_cast<std::size_t>(stage)], mine.backward_input[static_cast<std::size_t>(stage)],
              mine.backward_weight[static_cast<std::size_t>(stage)]});
    pipeline::AutoOptions a;
    a.stages = P;
    a.micro_batches = m;
    a.costs.forward.assign(static_cast<std::size_t>(P), 0);
    a.costs.backward_input.assign(static_cast<std::size_t>(P), 0);
    a.costs.backward_weight.assign(static_cast<std::size_t>(P), 0);
    const std::size_t ranks = rows.size() / 3;
    for (std::size_t q = 0; q < ranks; ++q) {
      const std::size_t st = all == nullptr ? static_cast<std::size_t>(stage) : q / static_cast<std::size_t>(D);
      a.costs.forward[st] += rows[3 * q] / D;
      a.costs.backward_input[st] += rows[3 * q + 1] / D;
      a.costs.backward_weight[st] += rows[3 * q + 2] / D;
    }
    for (int limit = P; limit >= 1; --limit) {
      a.memory_limit = {static_cast<double>(limit)};
      pipeline::Schedule s = pipeline::zb_auto(a);
      bool fits = true;
      for (int st = 0; st < P && fits; ++st) {
        const auto replay = [&](const pipeline::Schedule& x) {
          return pipeline::stage_memory(x, st, layers, eso.executor.remat, device::Arena::kAlignment,
                                        device::Backend::host);  // the pipelined trainer's stages: host devices
        };
        fits = replay(s).fits_in(replay(first));
      }
      if (!fits) continue;
      if (printer) {
        std::printf("zb-auto from step %d's measured times (", o.measure_steps);
        for (int st = 0; st < P; ++st)
          std::printf("%sstage %d F %.2f B %.2f W %.2f ms", st ? ", " : "", st, 1e3 * a.costs.f(st),
                      1e3 * a.costs.b(st), 1e3 * a.costs.w(st));
        std::printf("), memory limit %d micro-batches\n", limit);
      }
      runner.reschedule(s);
      return;
    }
    if (printer) std::printf("zb-auto: no schedule fits the activations reserved for ZB-H1; staying on ZB-H1\n");
  }

  // Every stage's fp32 parameters (replica 0's) to the printer, which writes them under the
  // plain trainer's names in its order. Collective over every rank.
  void save(StageRunner& runner, const pipeline::PipelineModel& layers, comm::Communicator* all, bool printer) const {
    const std::vector<float> mine = runner.parameters();  // collective over the stage's group
    const auto layers_of = [&](int st) { return pipeline::stage_layers(first, layers, st); };
    std::vector<float> whole = mine;
    if (all != nullptr) {
      std::vector<std::size_t> counts(static_cast<std::size_t>(all->world_size()), 0);
      for (int st = 0; st < P; ++st)
        for (int id : layers_of(st)) counts[static_cast<std::size_t>(st * D)] += layers.stored_params(id);
      std::size_t total = 0;
      for (auto c : counts) total += c;
      whole.assign(total, 0.0f);
      all->all_gather_v(mine.data(), whole.data(), counts, DType::fp32);  // replicas d > 0 send nothing
    }
    if (!printer) return;
    std::map<std::string, model::NamedTensor> by_name;
    const float* at = whole.data();
    for (int st = 0; st < P; ++st) {
      for (int id : layers_of(st)) {
        const float* end = at + layers.stored_params(id);
        for (const auto& p : model.layer_tensors(id)) {
          if (at == end) break;  // a tied tail: its owner's
          std::size_t n = 1;
          for (auto e : p.shape) n *= static_cast<std::size_t>(e);
          by_name[p.name] = {p.name, p.shape, std::vector<float>(at, at + n)};
          at += n;
        }
      }
    }
    std::vector<model::NamedTensor> tensors;
    for (const auto& p : model.tensors) tensors.push_back(std::move(by_name.at(p.name)));
    model::write_safetensors(o.save_params, tensors,
                             {{"format", "pt"},
                              {"producer", "strata train --pipeline-stages"},
                              {"zero_stage", std::to_string(eso.config.zero.stage)},
                              {"pipeline_stages", std::to_string(P)},
                              {"steps", std::to_string(o.steps)}});
    std::printf("saved %zu tensors to %s\n", tensors.size(), o.save_params.c_str());
  }

  // --explain: replica 0's stages print their placements in stage order (collective over
  // every rank).
  void explain(StageRunner& runner, int stage, int d, comm::Communicator* all) const {
    const std::string text = runner.engine().explain_placement();
    for (int st = 0; st < P; ++st) {
      if (st == stage && d == 0) {
        std::printf("stage %d placement:\n%s", stage, text.c_str());
        std::fflush(stdout);
      }
      if (all != nullptr) all->barrier();
    }
  }

  // Stage `stage` of replica d for every step; `all` spans every rank (rank = stage * D + d).
  void rank(int stage, int d, comm::Communicator* group, comm::Communicator* pipe, comm::Communicator* all,
            pipeline::Transport& transport, Tracer* tracer) {
    const bool printer = stage == 0 && d == 0;
    auto g = model.replica(d);
    StageRunner runner(first, g.model, eso, stage, group, pipe, transport, tracer);
    if (printer)
      std::printf("strata train: %s, %d pipeline stage(s) (%s) x %d replica(s), ZeRO stage %d, micro-batch %d x %d\n",
                  model.describe.c_str(), P, zb_auto ? "zb-auto" : first.kind.c_str(), D, eso.config.zero.stage, B, m);
    if (printer) std::printf("  optimizer: %s\n", engine::describe_training(eso.config).c_str());
    if (printer && !ckpt.init_from.empty())
      std::printf("initialised %zu tensors from %s\n", model.tensors.size(), ckpt.init_from.c_str());
    if (o.explain) explain(runner, stage, d, all);
    const std::int64_t start = ckpt.load(runner.engine(), stage, all, g.fp8.get());
    require_steps_after_resume(start, o.steps, o.ckpt.resume);
    if (start > 0) {
      runner.start_at(start);
      if (printer)
        std::printf("resumed from %s at step %lld\n", o.ckpt.resume.c_str(), static_cast<long long>(start + 1));
    }
    pipeline::StageReport last;
    for (std::int64_t s = start; s < o.steps; ++s) {
      if (zb_auto && s == start + o.measure_steps) go_auto(runner, g.model, last, stage, all, printer);
      const auto t0 = std::chrono::steady_clock::now();
      if (g.fp8) g.fp8->set_recording(true);  // the step's passes; validation and sampling record nothing
      last = runner.step();
      if (g.fp8) {
        g.fp8->set_recording(false);
        end_fp8_step(*g.fp8, group);
      }
      if (tracer != nullptr) record_actions(*tracer, last);
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      double val = std::nan("");
      if (g.val_input && validation_due(o.m, s + 1, o.steps)) {
        double sum = 0;
        runner.forward(o.m.eval_batches, g.val_input, [&](int v, const float* y) { sum += g.val_loss(v, y); });
        const double tokens = static_cast<double>(o.m.eval_batches) * static_cast<double>(model.units_per_micro);
        if (stage == P - 1) val = sum / tokens;
      }
      double losses = 0;
      if (stage == P - 1)
        for (double l : *g.losses) losses += l;
      const auto mem = runner.engine().memory();
      const auto num = [](std::uint64_t b) { return static_cast<double>(b); };
      const engine::StepResult& r = runner.store().last_step();
      const auto rows =
          gather_rows(all, {losses, val, dt, r.grad_norm, r.loss_scale, r.skipped ? 1.0 : 0.0, r.lr,
                            num(mem.device.used_bytes), num(mem.device.peak_bytes), num(mem.device.budget_bytes),
                            num(mem.device_memory_peak), num(mem.host.peak_bytes), num(mem.nvme.used_bytes)});
      if (printer) {
        const PipelinedReport reporter{.P = P,
                                       .D = D,
                                       .steps = o.steps,
                                       .tokens_per_step = tokens_per_step,
                                       .printing = {.level = o.printing, .every = eso.config.steps_per_print},
                                       .log = log.is_open() ? &log : nullptr,
                                       .log_path = o.log_json};
        reporter.report(s, rows);
      }
      if (ckpt.after_step(runner.engine(), stage, s, o.steps, printer, g.fp8.get()) && printer)
        std::printf("%s checkpoint step %lld under %s/stage<0..%d>%s\n", ckpt.async ? "staged" : "saved",
                    static_cast<long long>(s + 1), ckpt.save_dir.c_str(), P - 1,
                    ckpt.async ? ", writing in the background" : "");
    }
    ckpt.finish_all(runner.engine(), stage, D, all, printer);
    if (o.m.sample > 0 && model.at_length) {
      const auto tokens = sample_pipelined(runner, model, P, stage, o.m.sample, o.m.seed, g.fp8.get());
      const std::string text = sample_text(tokens, model.vocab, o.m.tokenizer);
      if (printer) std::printf("sample (%zu bytes):\n%s\n", text.size(), text.c_str());
    }
    if (!o.save_params.empty()) save(runner, g.model, all, printer);
  }
};

// Refuses what a pipelined run cannot take, and returns the flags with the defaults that
// depend on others filled in (--measure-steps: 1 under zb-auto).
PipelineTrainOptions check_flags(PipelineTrainOptions o) {
  STRATA_CHECK(o.stages >= 1, Errc::invalid_argument, "--pipeline-stages ", o.stages, " must be at least 1");
  STRATA_CHECK(o.steps >= 1, Errc::invalid_argument, "--steps ", o.steps, " must be >= 1");
  STRATA_CHECK(o.measure_steps == 0 || o.schedule == "zb-auto", Errc::invalid_argument, "--measure-steps ",
               o.measure_steps, " applies only to --schedule zb-auto (this run's schedule is ", o.schedule,
               "): drop it, or choose zb-auto");
  if (o.measure_steps == 0) o.measure_steps = 1;
  STRATA_CHECK(o.schedule != "zb-auto" || (o.measure_steps >= 1 && o.measure_steps < o.steps), Errc::invalid_argument,
               "--measure-steps ", o.measure_steps, " must be at least 1 and below --steps ", o.steps,
               " (zb-auto runs that many ZB-H1 steps first)");
  return o;
}

// One process per (stage, replica) under strata launch: the stage's and the pipe's
// communicators, its transport, and this rank's trace.
void run_as_ranks(Run& run, const comm::RendezvousConfig& rdzv, int world) {
  const PipelineTrainOptions& o = run.o;
  comm::CommOptions wo;
  wo.rendezvous = rdzv;
  auto all = comm::Communicator::create(wo);
  const int r = all->rank(), stage = r / run.D, d = r % run.D;
  auto group = sub_comm(rdzv, "stage" + std::to_string(stage), d, run.D);
  auto pipe = sub_comm(rdzv, "pipe" + std::to_string(d), stage, run.P);
  auto p2p = sub_comm(rdzv, "p2p" + std::to_string(d), stage, run.P);
  Tracer tracer(!o.trace.empty(), r, Tracer::Clock::now(), str_cat("stage ", stage, " replica ", d));
  if (p2p) {
    pipeline::CommTransport transport(*p2p);
    run.rank(stage, d, group.get(), pipe.get(), all.get(), transport, &tracer);
  } else {
    pipeline::LocalMailboxes boxes;
    pipeline::LocalTransport transport(boxes, 0);
    run.rank(stage, d, group.get(), pipe.get(), all.get(), transport, &tracer);
  }
  if (!o.trace.empty()) {
    const std::string path = o.trace + ".rank" + std::to_string(r);
    tracer.write(path);
    if (r == 0) std::printf("trace: %s.rank<0..%d> (open in https://ui.perfetto.dev)\n", o.trace.c_str(), world - 1);
  }
}

// Stages as threads of this process: one replica, in-process mailboxes, one merged trace.
void run_as_threads(Run& run) {
  const PipelineTrainOptions& o = run.o;
  char dir_template[] = "/tmp/strata-train-pipeline-XXXXXX";
  STRATA_CHECK(::mkdtemp(dir_template) != nullptr, Errc::io, "cannot make a rendezvous directory under /tmp");
  comm::RendezvousConfig base;
  base.path = dir_template;
  base.run_id = "threads";
  pipeline::LocalMailboxes boxes;
  std::exception_ptr first;
  std::mutex mutex;
  std::vector<std::thread> threads;
  const auto origin = Tracer::Clock::now();
  for (int st = 0; st < run.P; ++st)
    run.tracers.push_back(std::make_unique<Tracer>(!o.trace.empty(), st, origin, str_cat("stage ", st)));
  for (int st = 0; st < run.P; ++st) {
    threads.emplace_back([&, st] {
      try {
        auto pipe = sub_comm(base, "pipe", st, run.P);
        auto all = sub_comm(base, "all", st, run.P);
        pipeline::LocalTransport transport(boxes, st);
        run.rank(st, 0, nullptr, pipe.get(), all.get(), transport, run.tracers[static_cast<std::size_t>(st)].get());
      } catch (const std::exception& e) {
        {
          std::lock_guard<std::mutex> lock(mutex);
          if (!first) first = std::current_exception();
        }
        boxes.abort(str_cat("stage ", st, " failed: ", e.what()));
      }
    });
  }
  for (auto& t : threads) t.join();
  std::error_code ec;
  std::filesystem::remove_all(dir_template, ec);
  if (first) std::rethrow_exception(first);
  if (!o.trace.empty()) {
    std::vector<const Tracer*> stages;
    for (const auto& t : run.tracers) stages.push_back(t.get());
    std::ofstream f(o.trace, std::ios::binary | std::ios::trunc);
    f << Tracer::merged_json(stages);
    f.close();
    STRATA_CHECK(f.good(), Errc::io, "--trace '", o.trace,
                 "' cannot be written (disk full or removed?): ", errno_text(errno));
    std::printf("trace: %s (open in https://ui.perfetto.dev)\n", o.trace.c_str());
  }
}

}  // namespace

int train_pipelined(const PipelineTrainOptions& given) {
  const PipelineTrainOptions o = check_flags(given);
  const comm::RendezvousConfig rdzv = comm::rendezvous_from_env();
  const bool as_ranks = !rdzv.path.empty() || rdzv.world_size > 1;
  const int world = as_ranks ? rdzv.world_size : o.stages;
  STRATA_CHECK(world % o.stages == 0, Errc::invalid_argument, "--pipeline-stages ", o.stages, " does not divide the ",
               world, " ranks: run strata launch -n P*D (P stages x D data-parallel replicas)");
  Run run{o, {}};
  run.P = o.stages;
  run.D = world / o.stages;
  engine::ModelFacts facts;
  facts.world_size = run.D;
  facts.total_steps = o.steps;
  facts.hidden_size = model_hidden_size(o.m);
  const engine::EngineConfig cfg = engine::load_config(o.config, facts);
  run.B = static_cast<int>(cfg.train_micro_batch_size_per_gpu);
  run.m = static_cast<int>(cfg.gradient_accumulation_steps);
  run.model = pipelined_model(o.m, cfg, run.B, run.m, run.D, as_ranks && rdzv.rank != 0);
  run.tokens_per_step =
      run.model.units_per_micro * static_cast<std::uint64_t>(run.m) * static_cast<std::uint64_t>(run.D);
  pipeline::GenerateOptions g;
  g.kind = pipeline::parse_schedule_kind(o.schedule);
  g.stages = run.P;
  g.micro_batches = run.m;
  g.chunks = o.chunks;
  run.zb_auto = g.kind == pipeline::ScheduleKind::zb_auto;
  if (run.zb_auto) g.kind = pipeline::ScheduleKind::zb_h1;
  run.first = pipeline::generate(g);
  const int vstages = run.first.virtual_stages();
  STRATA_CHECK(run.model.pipeline_layers % vstages == 0, Errc::invalid_argument, "--pipeline-stages ", run.P,
               run.first.chunks > 1 ? str_cat(" x --chunks ", run.first.chunks) : std::string(), " = ", vstages,
               " virtual stages cannot split ", run.model.split_hint(vstages));
  run.eso.config = cfg;
  run.eso.replicas = run.D;
  run.eso.seed = o.m.seed;
  if (cfg.memory_budget.device > 0)
    run.eso.device_budget = cfg.memory_budget.device;
  else if (!o.device_budget.empty())
    run.eso.device_budget = parse_bytes(o.device_budget, "--device-budget");
  run.eso.executor.remat = run.model.remat;
  run.eso.link_gbps = o.link_gbps;
  run.ckpt.save_dir = o.ckpt.save_dir.empty() ? cfg.checkpoint.save_dir : o.ckpt.save_dir;
  run.ckpt.resume = o.ckpt.resume == "latest" ? run.ckpt.save_dir : o.ckpt.resume;
  run.ckpt.save_every = o.ckpt.save_every >= 0 ? o.ckpt.save_every : cfg.checkpoint.save_every;
  run.ckpt.keep = o.ckpt.keep >= 0 ? o.ckpt.keep : cfg.checkpoint.keep;
  run.ckpt.seed = o.m.seed;
  run.ckpt.stages = run.P;
  run.ckpt.unit_scaled = o.m.model == "gpt" && o.m.unit_scaled;
  run.ckpt.model_state = run.model.state;
  run.ckpt.check_model_state = run.model.check_state;
  run.ckpt.init_from = o.ckpt.init_from;
  STRATA_CHECK(run.ckpt.resume.empty() || run.ckpt.init_from.empty(), Errc::invalid_argument,
               "--resume and --init-from both given: a resumed run continues its checkpoint; pick one");
  run.eso.init_values = run.ckpt.initial_values(run.model);
  if (!run.eso.init_values && run.ckpt.resume.empty()) run.eso.init_values = run.model.weights;
  run.ckpt.async = o.ckpt.async || cfg.checkpoint.async;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  run.eso.executor.compute_threads = std::max(1, cores / world);  // the ranks share this host's cores
  const bool printer = !as_ranks || rdzv.rank == 0;
  if (printer && !o.save_params.empty()) check_output_file("--save-params", o.save_params);
  if (printer && !o.trace.empty()) check_output_file("--trace", o.trace);
  if (printer && !o.log_json.empty()) {
    check_output_file("--log-json", o.log_json);
    run.log.open(o.log_json, std::ios::trunc);
    STRATA_CHECK(run.log.good(), Errc::io, "--log-json '", o.log_json,
                 "' cannot be opened for writing: ", errno_text(errno));
  }

  if (as_ranks)
    run_as_ranks(run, rdzv, world);
  else
    run_as_threads(run);
  return 0;
}

}  // namespace strata::train
