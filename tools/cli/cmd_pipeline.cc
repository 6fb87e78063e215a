// `strata pipeline`: runs a schedule with the executor on a synthetic model, or with
// --model gpt on the GPT (pipeline_model.h), and sets the measured timeline against the
// simulated one. Stages are threads of this process, or -- under `strata launch -n p` --
// one process per stage talking through Gloo send/recv (rank 0 prints the report).
// --layer-ms gives layers with fixed F/B/W times (steady, for bubble measurements); without
// it the layers are real tanh-linear compute. --verify checks the gradients bit for bit
// against a sequential loop over the micro-batches. --measure-steps K feeds zb-auto the
// per-stage F/B/W times of K ZB-H1 steps. --config FILE puts every stage on a ZeRO engine
// with that DeepSpeed-style config (pipeline_engine.h), --replicas D data-parallel copies
// of the pipeline beside it; then --verify checks the parameters after the run against a
// plain data-parallel engine run.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "pipeline/generators.h"
#include "pipeline/runner.h"
#include "pipeline/simulate.h"
#include "runtime/comm/communicator.h"
#include "runtime/core/error.h"
#include "runtime/core/units.h"
#include "tools/cli/command.h"
#include "tools/cli/pipeline_model.h"
#include "train/pipeline_engine.h"

namespace strata::cli {

using namespace strata::train;  // the library these commands parse flags for
namespace {

struct Options {
  std::string kind = "1f1b";
  int stages = 4, micro = 8, chunks = 1, layers = 0, width = 64, rows = 8, steps = 2;
  double layer_ms = 0;
  std::string ratios = "1,1,1";
  std::string remat = "never";
  std::string trace, svg;
  bool json = false, verify = false;
  std::string config;  // stages on ZeRO engines
  int replicas = 1;
  std::string device_budget;  // each stage's device, with --config
  int measure_steps = 0;      // zb-auto: steps of ZB-H1 whose per-stage F/B/W times feed it
  PipelineModelFlags model;   // synthetic or the GPT
  int stage_threads = -1;     // each stage's compute threads; -1: the GPT's share of the cores, else the pool
};

std::vector<double> parse_ratios(const std::string& text) {
  std::vector<double> v;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const double x = std::strtod(item.c_str(), &end);
    STRATA_CHECK(end != item.c_str() && *end == '\0' && x >= 0, Errc::invalid_argument, "--times '", text, "': '", item,
                 "' is not a number >= 0");
    v.push_back(x);
  }
  STRATA_CHECK(v.size() == 3, Errc::invalid_argument, "--times '", text, "' needs F,B,W (relative layer times)");
  return v;
}

std::string bytes(double b) { return format_bytes(static_cast<std::uint64_t>(b)); }

std::string percent(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f%%", 100 * x);
  return buf;
}

// Per-stage mean F, B, W times of a measured run (a BW splits between B and W as the nominal
// ratios do).
pipeline::Costs measured_costs(const pipeline::Schedule& s, const std::vector<pipeline::StageReport>& reports,
                               const std::vector<double>& ratio) {
  return pipeline::measured_costs(s, reports, ratio[1] + ratio[2] > 0 ? ratio[1] / (ratio[1] + ratio[2]) : 0.5);
}

// Every stage's gradients against a sequential loop over the whole model, bit for bit; as
// ranks, every rank checks its own layers and all learn whether any differed.
bool gradients_match(const pipeline::PipelineModel& model, int micro, std::uint64_t seed, std::int64_t step,
                     const std::vector<std::unique_ptr<pipeline::LocalParameterStore>>& stores,
                     comm::Communicator* comm) {
  bool equal = true;
  std::vector<int> all(model.layers.size());
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
  pipeline::LocalParameterStore reference(model, all, seed);
  pipeline::run_sequential(model, micro, reference, step);
  for (const auto& st : stores) {
    for (int id : st->layers()) equal = equal && st->grads_of(id) == reference.grads_of(id);
  }
  if (comm != nullptr) {  // every rank checked its own layers; rank 0 reports them all
    float differs = equal ? 0.0f : 1.0f;
    comm->all_reduce(&differs, 1, DType::fp32, comm::ReduceOp::max);
    if (!equal) std::fprintf(stderr, "rank %d: gradients differ from the sequential loop\n", comm->rank());
    equal = differs == 0.0f;
  }
  return equal;
}

// What a run settles before it builds the model: the schedule's options, the synthetic
// model's spec, the executor's options and, with --config, the engines' (read once, for
// every run below).
struct Prepared {
  comm::RendezvousConfig rdzv;
  bool as_ranks = false;
  pipeline::GenerateOptions g;
  std::vector<double> ratio;
  int layers = 0;
  double unit_s = 0;  // a whole stage's F at ratio 1 (--layer-ms)
  pipeline::SyntheticModelSpec spec;
  pipeline::ExecutorOptions eo;
  EngineStagesOptions engines;
};

Prepared prepare(const Options& o) {
  STRATA_CHECK(o.device_budget.empty() || !o.config.empty(), Errc::invalid_argument,
               "--device-budget needs --config: it sizes the devices of stages on ZeRO engines");
  STRATA_CHECK(o.replicas == 1 || !o.config.empty(), Errc::invalid_argument, "--replicas ", o.replicas,
               " needs --config: data-parallel replicas run on ZeRO engines");
  Prepared p;
  p.rdzv = comm::rendezvous_from_env();
  p.as_ranks = !p.rdzv.path.empty() || p.rdzv.world_size > 1;
  p.g.kind = pipeline::parse_schedule_kind(o.kind);
  p.g.stages = o.stages;
  p.g.micro_batches = o.micro;
  p.g.chunks = o.chunks;
  p.ratio = parse_ratios(o.ratios);
  const auto& ratio = p.ratio;
  const bool gpt = o.model.model == "gpt";
  STRATA_CHECK(!gpt || o.layer_ms == 0, Errc::invalid_argument,
               "--layer-ms fixes synthetic layers' times; the GPT's are its own compute: drop it");
  p.layers = o.layers > 0 || gpt ? o.layers : o.stages * o.chunks;
  p.unit_s = o.layer_ms / 1e3 * p.layers / o.stages;
  p.g.costs = pipeline::Costs::uniform(ratio[0], ratio[1], ratio[2]);

  pipeline::SyntheticModelSpec& spec = p.spec;
  spec.layers = p.layers;
  spec.width = static_cast<std::size_t>(o.width);
  spec.rows = static_cast<std::size_t>(o.rows);
  spec.micro_batches = o.micro;
  spec.layer_time_s = o.layer_ms / 1e3;
  spec.f = ratio[0];
  spec.b = ratio[1];
  spec.w = ratio[2];
  if (gpt) spec.seed = o.model.gpt.seed;  // the GPT's initial values and data from --seed, as strata train's
  p.eo.remat = pipeline::parse_remat(o.remat);
  // Stages stand for devices of their own: a GPT stage computes on its share of the cores.
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  p.eo.compute_threads = o.stage_threads >= 0 ? o.stage_threads
                         : gpt                ? std::max(1, cores / (o.stages * o.replicas))
                                              : 0;
  if (!o.config.empty()) {
    engine::ModelFacts facts;
    facts.world_size = o.replicas;
    facts.hidden_size = pipeline_model_hidden(o.model, p.layers, spec);
    auto& eso = p.engines;
    eso.config = engine::load_config(o.config, facts);
    STRATA_CHECK(!eso.config.fp8.enabled, Errc::unsupported, "--config '", o.config,
                 "': fp8.enabled: strata pipeline runs its layers without FP8 products (nothing here moves their "
                 "amax histories); train a pipelined GPT with FP8 through strata train --pipeline-stages P");
    eso.replicas = o.replicas;
    eso.steps = o.steps;
    eso.verify = o.verify;
    eso.seed = spec.seed;
    eso.executor = p.eo;
    if (!o.device_budget.empty()) eso.device_budget = parse_bytes(o.device_budget, "--device-budget");
  }
  return p;
}

// --measure-steps: zb-auto's costs as measured in ZB-H1 steps, into p.g.costs; returns them
// in words.
std::string measure_auto_costs(const Options& o, Prepared& p, const PipelineModelChoice& chosen) {
  STRATA_CHECK(p.g.kind == pipeline::ScheduleKind::zb_auto, Errc::invalid_argument,
               "--measure-steps feeds zb-auto the times measured in ZB-H1 steps; it needs --kind zb-auto");
  STRATA_CHECK(!p.as_ranks, Errc::invalid_argument,
               "--measure-steps runs its ZB-H1 steps with stages as threads; under strata launch give the "
               "times with --times");
  const pipeline::Schedule h1 = pipeline::zb_h1(o.stages, o.micro);
  std::vector<pipeline::StageReport> first;
  if (!o.config.empty()) {
    auto eso = p.engines;
    eso.steps = o.measure_steps;
    eso.verify = false;
    first = run_on_engines(h1, chosen.of_replica, eso).reports;
  } else {
    std::vector<std::unique_ptr<pipeline::LocalParameterStore>> local;
    std::vector<pipeline::ParameterStore*> ptrs;
    for (int st = 0; st < h1.stages; ++st) {
      local.push_back(std::make_unique<pipeline::LocalParameterStore>(
          chosen.model, pipeline::stage_layers(h1, chosen.model, st), p.spec.seed));
      ptrs.push_back(local.back().get());
    }
    first = pipeline::run_stages_as_threads(h1, chosen.model, ptrs, p.eo, o.measure_steps);
  }
  p.g.costs = measured_costs(h1, first, p.ratio);
  std::string out;
  for (int st = 0; st < o.stages; ++st) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "%sstage %d F %.2f B %.2f W %.2f ms", st ? "; " : "", st, 1e3 * p.g.costs.f(st),
                  1e3 * p.g.costs.b(st), 1e3 * p.g.costs.w(st));
    out += buf;
  }
  return out;
}

// The schedule; zb-auto on engines within a device budget takes its memory limit from the
// budget (said in budget_limit).
pipeline::Schedule make_schedule(const Options& o, const Prepared& p, const pipeline::PipelineModel& model,
                                 std::string& budget_limit) {
  if (p.g.kind != pipeline::ScheduleKind::zb_auto || o.config.empty() || o.device_budget.empty())
    return pipeline::generate(p.g);
  pipeline::AutoOptions a;
  a.stages = p.g.stages;
  a.micro_batches = p.g.micro_batches;
  a.costs = p.g.costs;
  auto b = zb_auto_within_budget(a, model, p.engines);
  budget_limit = str_cat(b.memory_limit, " micro-batches, the largest whose activations and engine minimum (",
                         format_bytes(b.need), " on the largest stage) fit --device-budget ", o.device_budget);
  return std::move(b.schedule);
}

// What the schedule's run gave: every stage's report on the reporting process (empty on the
// others), the engines' summaries, and the --verify verdict.
struct Ran {
  std::vector<pipeline::StageReport> reports;
  std::vector<StageSummary> on_engines;
  std::string verdict = "not checked (--verify)";
  bool equal = true;
  bool reporter = true;  // on engines: this process prints the report (ranks: the one with reports)
};

Ran execute(const Options& o, const Prepared& p, const pipeline::Schedule& s, const PipelineModelChoice& chosen) {
  Ran r;
  const pipeline::PipelineModel& model = chosen.model;
  std::vector<std::unique_ptr<pipeline::LocalParameterStore>> stores;
  std::unique_ptr<comm::Communicator> comm;
  if (!o.config.empty()) {
    auto eso = p.engines;
    if (!p.as_ranks) eso.trace = o.trace;  // threads: the engine's rows too (one file for every stage)
    const auto res = run_on_engines(s, chosen.of_replica, eso);
    r.equal = res.equal;
    if (o.verify)
      r.verdict =
          r.equal ? "bitwise equal to the plain data-parallel run" : "DIFFERENT from the plain data-parallel run";
    r.reporter = res.reporter;
    if (r.reporter) {
      r.reports = res.reports;
      r.on_engines = res.stages;
    }
    return r;
  }
  if (p.as_ranks) {
    comm::CommOptions co;
    co.rendezvous = p.rdzv;
    comm = comm::Communicator::create(co);
    stores.push_back(std::make_unique<pipeline::LocalParameterStore>(
        model, pipeline::stage_layers(s, model, comm->rank()), p.spec.seed));
    const auto mine = pipeline::run_stage_as_rank(s, model, *stores[0], *comm, p.eo, o.steps);
    r.reports = pipeline::gather_reports(*comm, mine);
  } else {
    std::vector<pipeline::ParameterStore*> ptrs;
    for (int st = 0; st < s.stages; ++st) {
      stores.push_back(
          std::make_unique<pipeline::LocalParameterStore>(model, pipeline::stage_layers(s, model, st), p.spec.seed));
      ptrs.push_back(stores.back().get());
    }
    r.reports = pipeline::run_stages_as_threads(s, model, ptrs, p.eo, o.steps);
  }
  if (o.verify) {
    r.equal = gradients_match(model, o.micro, p.spec.seed, o.steps - 1, stores, comm.get());
    r.verdict = r.equal ? "bitwise equal to the sequential loop" : "DIFFERENT from the sequential loop";
  }
  return r;
}

// The report's figures: the measured timeline, the simulator fed this run's per-stage F/B/W
// times and what a message took, and the nominal one (--layer-ms).
struct Figures {
  pipeline::TimelineStats got, from_measured, nominal;
  pipeline::Costs run_costs;
  std::string mode;
  double loss = std::nan("");  // the GPT's mean token loss in the last step, where this process saw it
};

Figures figures(const Options& o, const Prepared& p, const pipeline::Schedule& s, const PipelineModelChoice& chosen,
                const Ran& r) {
  Figures f;
  const auto& ratio = p.ratio;
  const pipeline::Timeline measured = pipeline::measured_timeline(s, r.reports);
  f.got = pipeline::summarize(measured);
  f.run_costs = measured_costs(s, r.reports, ratio);
  f.run_costs.comm = pipeline::measured_comm(s, r.reports);
  f.from_measured = pipeline::simulate(s, f.run_costs).stats;
  if (o.layer_ms > 0) {
    f.nominal =
        pipeline::simulate(s, pipeline::Costs::uniform(p.unit_s * ratio[0], p.unit_s * ratio[1], p.unit_s * ratio[2]))
            .stats;
  }
  f.mode =
      p.as_ranks ? str_cat(s.stages * o.replicas, " processes (Gloo)") : str_cat(s.stages * o.replicas, " threads");
  if (!o.config.empty()) f.mode += str_cat(", ", o.replicas, " replica(s) on ZeRO engines (", o.config, ")");
  if (!o.trace.empty() && (o.config.empty() || p.as_ranks))
    pipeline::write_file(o.trace, pipeline::to_chrome_trace(measured));
  if (!o.svg.empty())
    pipeline::write_file(
        o.svg, pipeline::to_svg(measured, str_cat(s.kind, " measured, ", f.mode, "   p=", s.stages,
                                                  "  m=", s.micro_batches, "   bubble ", percent(f.got.bubble_rate))));
  if (chosen.losses && !p.as_ranks) {
    f.loss = 0;
    for (double l : *chosen.losses) f.loss += l;
    f.loss /= static_cast<double>(chosen.tokens_per_micro) * s.micro_batches;
  }
  return f;
}

void print_report_json(const Options& o, const Prepared& p, const pipeline::Schedule& s,
                       const PipelineModelChoice& chosen, const Ran& r, const Figures& f, const std::string& auto_costs,
                       const std::string& budget_limit) {
  nlohmann::json j = {{"kind", s.kind},
                      {"model", chosen.describe},
                      {"stages", s.stages},
                      {"micro_batches", s.micro_batches},
                      {"chunks", s.chunks},
                      {"mode", p.as_ranks ? "processes" : "threads"},
                      {"remat", o.remat},
                      {"measured",
                       {{"makespan_s", f.got.makespan},
                        {"bubble_rate", f.got.bubble_rate},
                        {"bubble_rate_per_stage", f.got.bubble_rate_per_stage}}},
                      {"simulated_from_measured_times",
                       {{"makespan_s", f.from_measured.makespan},
                        {"bubble_rate", f.from_measured.bubble_rate},
                        {"comm_s", f.run_costs.comm}}},
                      {"peak_activations", [&] {
                         std::vector<double> v;
                         for (const auto& rep : r.reports) v.push_back(rep.peak_activations);
                         return v;
                       }()}};
  if (f.loss == f.loss) j["loss"] = f.loss;
  if (o.layer_ms > 0)
    j["simulated_nominal"] = {{"makespan_s", f.nominal.makespan}, {"bubble_rate", f.nominal.bubble_rate}};
  if (o.verify) j[o.config.empty() ? "gradients_bitwise_equal" : "parameters_bitwise_equal"] = r.equal;
  if (!r.on_engines.empty()) {
    nlohmann::json st = nlohmann::json::array();
    for (const auto& e : r.on_engines)
      st.push_back({{"activation_peak_bytes", e.activations},
                    {"device_peak_bytes", e.device_peak},
                    {"host_peak_bytes", e.host_peak},
                    {"nvme_bytes", e.nvme_used},
                    {"nvme_read_bytes", e.nvme_read},
                    {"nvme_write_bytes", e.nvme_write},
                    {"grad_norm", e.grad_norm},
                    {"clip_coef", e.clip_coef}});
    j["engines"] = st;
  }
  if (!budget_limit.empty()) j["zb_auto_memory_limit"] = budget_limit;
  if (!auto_costs.empty()) {
    nlohmann::json c = nlohmann::json::array();
    for (int st = 0; st < s.stages; ++st)
      c.push_back({{"f_s", p.g.costs.f(st)}, {"b_s", p.g.costs.b(st)}, {"w_s", p.g.costs.w(st)}});
    j["zb_auto_costs_measured_in_zb_h1"] = c;
  }
  print_json(j.dump(2));
}

void print_report_text(const Options& o, const Prepared& p, const pipeline::Schedule& s,
                       const PipelineModelChoice& chosen, const Ran& r, const Figures& f, const std::string& auto_costs,
                       const std::string& budget_limit) {
  std::printf(
      "pipeline %s: p=%d m=%d v=%d, %s, %s, remat %s%s\n", s.kind.c_str(), s.stages, s.micro_batches, s.chunks,
      chosen.describe.c_str(), f.mode.c_str(), o.remat.c_str(),
      p.eo.compute_threads > 0 ? str_cat(", ", p.eo.compute_threads, " compute thread(s) a stage").c_str() : "");
  if (f.loss == f.loss)
    std::printf("GPT last step: loss %.4f, %.0f tokens/s (replica 0's pipeline)\n", f.loss,
                static_cast<double>(chosen.tokens_per_micro) * s.micro_batches / f.got.makespan);
  if (!budget_limit.empty()) std::printf("zb-auto memory limit %s\n", budget_limit.c_str());
  if (!auto_costs.empty())
    std::printf("zb-auto from %d ZB-H1 step(s)' measured times: %s\n", o.measure_steps, auto_costs.c_str());
  std::printf("measured           makespan %.4f s  bubble %s\n", f.got.makespan, percent(f.got.bubble_rate).c_str());
  if (o.layer_ms > 0)
    std::printf("simulated nominal  makespan %.4f s  bubble %s\n", f.nominal.makespan,
                percent(f.nominal.bubble_rate).c_str());
  std::printf(
      "simulated measured makespan %.4f s  bubble %s (per-stage mean F/B/W and a message's %.3f ms from this run)\n",
      f.from_measured.makespan, percent(f.from_measured.bubble_rate).c_str(), 1e3 * f.run_costs.comm);
  for (const auto& rep : r.reports) {
    std::printf("stage %d: bubble %s, peak activations %g micro-batches, %d recomputed\n", rep.stage,
                percent(f.got.bubble_rate_per_stage[rep.stage]).c_str(), rep.peak_activations, rep.recomputed);
    if (!r.on_engines.empty()) {
      const auto& e = r.on_engines[rep.stage];
      std::printf(
          "  activations %s (replayed peak); engine: device peak %s, host peak %s, NVMe %s; last step NVMe read %s "
          "written %s, grad norm %.4g, clip %.4g\n",
          bytes(e.activations).c_str(), bytes(e.device_peak).c_str(), bytes(e.host_peak).c_str(),
          bytes(e.nvme_used).c_str(), bytes(e.nvme_read).c_str(), bytes(e.nvme_write).c_str(), e.grad_norm,
          e.clip_coef);
    }
  }
  std::printf("%s: %s\n", o.config.empty() ? "gradients" : "parameters", r.verdict.c_str());
}

int run(const Options& o) {
  Prepared p = prepare(o);
  // The GPT's weight products in the engines' compute dtype, as the unpipelined GPT's.
  const auto products = o.config.empty() ? model::ops::Products::fp32
                                         : model::ops::products_for(engine::compute_dtype_of(p.engines.config));
  const PipelineModelChoice chosen = make_pipeline_model(o.model, p.layers, p.spec, o.micro, o.replicas, products);
  const std::string auto_costs = o.measure_steps > 0 ? measure_auto_costs(o, p, chosen) : "";
  std::string budget_limit;
  const pipeline::Schedule s = make_schedule(o, p, chosen.model, budget_limit);
  const Ran r = execute(o, p, s, chosen);
  if (!r.reporter || r.reports.empty()) return r.equal ? 0 : 1;  // not rank 0
  const Figures f = figures(o, p, s, chosen, r);
  if (o.json)
    print_report_json(o, p, s, chosen, r, f, auto_costs, budget_limit);
  else
    print_report_text(o, p, s, chosen, r, f, auto_costs, budget_limit);
  return r.equal ? 0 : 1;
}

Action setup(CLI::App& cmd) {
  auto o = std::make_shared<Options>();
  cmd.add_option("--kind", o->kind, "gpipe|1f1b|interleaved|zb-h1|zb-h2|zb-auto");
  cmd.add_option("--stages,-p", o->stages, "Stages p (under strata launch: the number of ranks)")
      ->check(CLI::Range(1, 64));
  cmd.add_option("--micro,-m", o->micro, "Micro-batches m")->check(CLI::Range(1, 4096));
  cmd.add_option("--chunks,-v", o->chunks, "Chunks per stage (interleaved)")->check(CLI::Range(1, 16));
  cmd.add_option("--layers", o->layers,
                 "Layers in all (default p*v); must divide into p*v. GPT: blocks (pipeline layers: blocks + 2)")
      ->check(CLI::Range(0, 4096));
  cmd.add_option("--layer-ms", o->layer_ms, "Fixed forward time per layer in ms (0: real tanh-linear compute)")
      ->check(CLI::Range(0.0, 10000.0));
  cmd.add_option("--times", o->ratios, "F,B,W times relative to --layer-ms (default 1,1,1)");
  cmd.add_option("--width", o->width, "Features per layer")->check(CLI::Range(1, 1 << 16));
  cmd.add_option("--rows", o->rows, "Rows per micro-batch")->check(CLI::Range(1, 1 << 16));
  cmd.add_option("--remat", o->remat, "Re-materialization: never|always|except_last");
  cmd.add_option("--steps", o->steps, "Steps to run (default 2); the last is reported, the first warms up")
      ->check(CLI::Range(1, 1000));
  cmd.add_flag("--verify", o->verify,
               "Check gradients against a sequential loop (with --config: parameters against a plain "
               "data-parallel engine run), bit for bit");
  cmd.add_option("--config", o->config,
                 "Run every stage on a ZeRO engine with this DeepSpeed-style config (fp32; "
                 "gradient_accumulation_steps = --micro)");
  cmd.add_option("--measure-steps", o->measure_steps,
                 "zb-auto: run this many ZB-H1 steps first and schedule with their per-stage F/B/W times "
                 "(stages as threads)")
      ->check(CLI::Range(0, 100));
  cmd.add_option("--device-budget", o->device_budget,
                 "Each stage's device memory with --config (\"64MiB\"; default the host device's 1 GiB); it holds the "
                 "schedule's activations and the engine's share");
  cmd.add_option("--replicas", o->replicas,
                 "Data-parallel replicas of the pipeline (with --config; under strata launch: p*replicas ranks)")
      ->check(CLI::Range(1, 64));
  add_pipeline_model_options(cmd, o->model);
  cmd.add_option("--stage-threads", o->stage_threads,
                 "Threads each stage's layer code uses (0: the process's pool; default: the GPT's stages share the "
                 "cores evenly, as stages on devices of their own)")
      ->check(CLI::Range(-1, 1024));
  cmd.add_flag("--json", o->json, "Print JSON");
  cmd.add_option("--trace", o->trace,
                 "Write the measured Chrome trace (Perfetto); with --config as threads, with the engines' rows "
                 "(scripts/trace_svg.py draws it)");
  cmd.add_option("--svg", o->svg, "Write the measured timeline as SVG");
  return [o] { return run(*o); };
}

const Registration reg("", "pipeline", "Run a pipeline schedule on a synthetic model or the GPT and measure its bubble",
                       setup);

}  // namespace
}  // namespace strata::cli
