// The plain trainer (see trainer.h).
#include "train/trainer.h"

#include <malloc.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/config.h"
#include "engine/engine.h"
#include "engine/rank_devices.h"
#include "models/safetensors.h"
#include "runtime/comm/communicator.h"
#include "runtime/core/error.h"
#include "runtime/core/host_memory.h"
#include "runtime/core/trace.h"
#include "runtime/core/units.h"
#include "runtime/device/device.h"
#include "train/interrupt.h"
#include "train/llama.h"
#include "train/output_check.h"

namespace strata::train {
namespace {

// bytes_per_parameter: what the tier holds now over the model's parameters.
nlohmann::json tier_json(const engine::TierUsage& u, std::uint64_t parameters) {
  nlohmann::json kinds;
  for (int k = 0; k < engine::kKinds; ++k) {
    kinds[engine::kind_name(static_cast<engine::Kind>(k))] = {{"used_bytes", u.kind_used[k]},
                                                              {"peak_bytes", u.kind_peak[k]}};
  }
  const double per = parameters > 0 ? static_cast<double>(u.used_bytes) / static_cast<double>(parameters) : 0.0;
  return {{"used_bytes", u.used_bytes},
          {"peak_bytes", u.peak_bytes},
          {"budget_bytes", u.budget_bytes},
          {"bytes_per_parameter", per},
          {"kinds", kinds}};
}

// The rank's device: the backend --device picks, budgets from the config or the flags.
device::DeviceOptions device_options(const TrainOptions& o, const engine::EngineConfig& cfg,
                                     const comm::CommOptions& co) {
  device::DeviceOptions dopt;
  dopt.backend = engine::choose_backend(o.device, co.rendezvous.world_size);
  if (o.device == "auto" && dopt.backend == device::Backend::host && co.rendezvous.rank == 0) {
    const auto gpus = device::cuda_inventory().devices.size();
    if (gpus > 0) {
      std::printf(
          "strata train: --device auto uses the host device: %d ranks but %zu GPU(s) here; name --device cuda "
          "to put each rank on GPU local_rank\n",
          co.rendezvous.world_size, gpus);
    }
  }
  STRATA_CHECK(o.link_gbps == 0 || dopt.backend == device::Backend::host, Errc::invalid_argument, "--link-gbps ",
               o.link_gbps,
               " throttles the host device's emulated link only; a CUDA device has its real one: drop it "
               "or use --device host");
  dopt.ordinal = co.rendezvous.local_rank;
  dopt.budget_bytes =
      cfg.memory_budget.device ? cfg.memory_budget.device : parse_bytes(o.device_budget, "--device-budget");
  dopt.pinned_budget_bytes = cfg.memory_budget.host ? cfg.memory_budget.host : (std::uint64_t{8} << 30);
  dopt.link_gbps = o.link_gbps;
  return dopt;
}

// --verbose: every detail of the step on two lines.
void print_verbose_step(std::int64_t s, std::int64_t steps, const StepOutcome& r, double ms, double tokens_per_s,
                        double val, const engine::MemoryReport& mem, const engine::IoStats& io, double nvme_gbps,
                        std::uint64_t rss_peak) {
  char val_text[32] = "";
  if (!std::isnan(val)) std::snprintf(val_text, sizeof val_text, "  val %.4f", val);
  std::printf(
      "step %4lld/%lld  loss %.6f%s  %7.1f ms  %.0f tok/s  grad-norm %.4g%s  device %s (peak %s / %s; device total "
      "peak %s)  host %s (peak %s)%s  rss peak %s\n",
      static_cast<long long>(s + 1), static_cast<long long>(steps), r.loss, val_text, ms, tokens_per_s,
      r.result.grad_norm,
      r.result.skipped       ? "  SKIPPED (overflow)"
      : r.result.rolled_back ? "  (overlapped optimizer undone: clipped)"
                             : "",
      format_bytes(mem.device.used_bytes).c_str(), format_bytes(mem.device.peak_bytes).c_str(),
      format_bytes(mem.device.budget_bytes).c_str(), format_bytes(mem.device_memory_peak).c_str(),
      format_bytes(mem.host.used_bytes).c_str(), format_bytes(mem.host.peak_bytes).c_str(),
      mem.nvme.used_bytes ? str_cat("  nvme ", format_bytes(mem.nvme.used_bytes)).c_str() : "",
      format_bytes(rss_peak).c_str());
  if (io.h2d_bytes + io.d2h_bytes + io.nvme_read_bytes + io.nvme_write_bytes > 0) {
    std::printf(
        "           io: H2D %s  D2H %s  NVMe read %s  write %s  (%.2f GB/s over the step)  waited on I/O %.1f ms\n",
        format_bytes(io.h2d_bytes).c_str(), format_bytes(io.d2h_bytes).c_str(),
        format_bytes(io.nvme_read_bytes).c_str(), format_bytes(io.nvme_write_bytes).c_str(), nvme_gbps,
        io.io_wait_seconds * 1e3);
  }
}

// Rank 0's line per step (step_report.h) and its --log-json object.
// rss_base: the process's resident bytes before anything was set up (libraries loaded).
void report_step(std::int64_t s, std::int64_t steps, const StepOutcome& r, double ms, double val,
                 const engine::MemoryReport& mem, const engine::IoStats& io, std::uint64_t rss_base,
                 const StepPrinting& printing, std::ofstream& log, const std::string& log_path) {
  const std::uint64_t rss_peak = process_peak_rss_bytes();
  // NVMe GB/s: the step's NVMe bytes over its wall time (what the step sustained).
  const double nvme_bytes = static_cast<double>(io.nvme_read_bytes + io.nvme_write_bytes);
  const double nvme_gbps = io.step_seconds > 0 ? nvme_bytes / io.step_seconds / 1e9 : 0.0;
  const double tokens_per_s = static_cast<double>(r.tokens) / (ms / 1e3);
  if (printing.prints(s, steps, !std::isnan(val), r.result.skipped)) {
    if (printing.level == StepPrinting::Level::verbose) {
      print_verbose_step(s, steps, r, ms, tokens_per_s, val, mem, io, nvme_gbps, rss_peak);
    } else {
      const double moved = static_cast<double>(io.h2d_bytes + io.d2h_bytes) + nvme_bytes;
      StepLine line{.step = s + 1,
                    .steps = steps,
                    .loss = r.loss,
                    .val = val,
                    .ms = ms,
                    .tokens_per_s = tokens_per_s,
                    .device_peak = mem.device_memory_peak,
                    .device_budget = mem.device.budget_bytes,
                    .host_peak = mem.host.peak_bytes,
                    .host_budget = mem.host.budget_bytes,
                    .io_gbps = io.step_seconds > 0 ? moved / io.step_seconds / 1e9 : 0.0,
                    .note = r.result.skipped       ? "skipped (overflow)"
                            : r.result.rolled_back ? "undone (clipped)"
                                                   : ""};
      std::printf("%s\n", compact_step_line(line).c_str());
    }
    std::fflush(stdout);
  }
  if (log.is_open()) {
    nlohmann::json j = {{"step", s + 1},
                        {"loss", r.loss},
                        {"step_ms", ms},
                        {"tokens_per_s", tokens_per_s},
                        {"grad_norm", r.result.grad_norm},
                        {"loss_scale", r.result.loss_scale},
                        {"lr", r.result.lr},
                        {"skipped", r.result.skipped},
                        {"rolled_back", r.result.rolled_back},
                        {"tail_layers", r.result.tail_layers},
                        {"deferred", r.result.deferred},
                        {"clip_coef", r.result.clip_coef},
                        {"tiers",
                         {{"device", tier_json(mem.device, mem.parameters)},
                          {"host", tier_json(mem.host, mem.parameters)},
                          {"nvme", tier_json(mem.nvme, mem.parameters)}}},
                        {"io",
                         {{"h2d_bytes", io.h2d_bytes},
                          {"d2h_bytes", io.d2h_bytes},
                          {"nvme_read_bytes", io.nvme_read_bytes},
                          {"nvme_write_bytes", io.nvme_write_bytes},
                          {"nvme_gbps", nvme_gbps},
                          {"io_wait_ms", io.io_wait_seconds * 1e3},
                          {"optimizer_wait_ms", io.optimizer_wait_seconds * 1e3},
                          {"engine_step_ms", io.step_seconds * 1e3}}},
                        {"gathered_elems_peak", mem.peak_gathered_elems},
                        {"device_memory_peak_bytes", mem.device_memory_peak},
                        {"rss", {{"base_bytes", rss_base}, {"bytes", process_rss_bytes()}, {"peak_bytes", rss_peak}}}};
    if (!std::isnan(val)) j["val_loss"] = val;
    log << j.dump() << "\n";
    log.flush();
    STRATA_CHECK(log.good(), Errc::io, "--log-json '", log_path, "': writing step ", s + 1,
                 " failed (disk full or removed?): ", errno_text(errno));
  }
}

// The final fp32 parameters as safetensors (a collective: every rank calls; rank 0 writes).
void save_params(engine::Engine& engine, const TrainOptions& o, const engine::EngineConfig& cfg, int world) {
  const auto flat = engine.full_parameters();  // collective
  if (engine.rank() == 0) {
    std::vector<model::NamedTensor> tensors;
    std::size_t off = 0;
    for (const auto& p : engine.layout().params()) {
      tensors.push_back({p.name, p.shape, std::vector<float>(flat.begin() + off, flat.begin() + off + p.numel)});
      off += p.numel;
    }
    model::write_safetensors(o.save_params, tensors,
                             {{"format", "pt"},
                              {"producer", "strata train"},
                              {"zero_stage", std::to_string(cfg.zero.stage)},
                              {"world_size", std::to_string(world)},
                              {"steps", std::to_string(o.steps)}});
    std::printf("saved %zu tensors to %s\n", tensors.size(), o.save_params.c_str());
  }
}

// --pipeline-stages: what the pipelined trainer takes, then it.
int run_pipelined(const TrainOptions& o) {
  STRATA_CHECK(o.device == "auto" || o.device == "host", Errc::invalid_argument, "--device ", o.device,
               " is not built for --pipeline-stages yet (pipeline stages run on the host device): drop it, or train "
               "without a pipeline");
  PipelineTrainOptions p = o.pipe;
  p.m = o.m;
  p.config = o.config;
  p.steps = o.steps;
  p.log_json = o.log_json;
  p.save_params = o.save_params;
  p.trace = o.trace;
  p.explain = o.explain;
  p.printing = o.printing;
  p.link_gbps = o.link_gbps;
  p.ckpt = o.ckpt;
  p.device_budget = o.device_budget;
  return train_pipelined(p);
}

}  // namespace

int run_training(const TrainOptions& o) {
  if (o.pipe.stages > 0) return run_pipelined(o);
  STRATA_CHECK(o.m.model == "mlp" || o.m.model == "gpt" || is_hf_model_dir(o.m.model), Errc::invalid_argument,
               "--model ", o.m.model, " is not available: ", unknown_model(o.m.model));
  STRATA_CHECK(o.steps >= 1, Errc::invalid_argument, "--steps ", o.steps, " must be >= 1");
  InterruptScope interrupt;  // from the start: a signal during setup also ends with the files removed
  // Buffers of 8 MiB and more (a layer's fp32 weights or gradients) are mapped and unmapped,
  // so the resident set follows what is live and `strata estimate` can predict it: glibc's
  // sliding threshold otherwise serves them from its heap after the first free and keeps
  // the freed pages (18 MB more at the peak of an MLP 4 x 2048). Fixing the threshold also
  // fixes the trim threshold at 128 KiB, which gave the heap top back and faulted it in again
  // every step (the GPT's step 7% slower): 16 MiB is where the sliding rule would put it.
  mallopt(M_MMAP_THRESHOLD, 8 << 20);
  mallopt(M_TRIM_THRESHOLD, 16 << 20);
  const std::uint64_t rss_base = process_rss_bytes();  // strata estimate reads its own here too
  comm::CommOptions co;
  co.rendezvous = comm::rendezvous_from_env();
  std::unique_ptr<comm::Communicator> comm;
  if (co.rendezvous.world_size > 1) comm = comm::Communicator::create(co);
  const int rank = co.rendezvous.rank, world = co.rendezvous.world_size;
  // Every output is checked before anything trains (rank 0 writes the shared ones).
  std::ofstream log;
  if (rank == 0 && !o.log_json.empty()) {
    check_output_file("--log-json", o.log_json);
    log.open(o.log_json, std::ios::trunc);
    STRATA_CHECK(log.good(), Errc::io, "--log-json '", o.log_json,
                 "' cannot be opened for writing: ", errno_text(errno));
  }
  if (rank == 0 && !o.save_params.empty()) check_output_file("--save-params", o.save_params);
  if (!o.trace.empty()) check_output_file("--trace", o.trace);

  engine::ModelFacts facts;
  facts.world_size = world;
  facts.total_steps = o.steps;
  facts.hidden_size = model_hidden_size(o.m);
  const engine::EngineConfig cfg = engine::load_config(o.config, facts);

  const device::DeviceOptions dopt = device_options(o, cfg, co);
  auto dev = device::Device::create(dopt);
  auto device_comm = engine::create_device_comm(co, dopt.backend, dopt.ordinal);

  Tracer tracer(!o.trace.empty(), rank);
  engine::EngineOptions eo;
  eo.config = cfg;
  eo.device = dev.get();
  eo.comm = comm.get();
  eo.device_comm = device_comm.get();
  eo.seed = o.m.seed;
  eo.tracer = &tracer;
  engine::Engine engine(eo);
  auto model = create_train_model(o.m, engine, comm.get(), &tracer);
  const TrainCheckpoints checkpoints(o.ckpt, cfg.checkpoint, o.m.seed, *model);
  engine.setup();
  if (o.ckpt.resume.empty() && o.ckpt.init_from.empty()) model->load_weights(engine);
  const std::int64_t first = checkpoints.resume(engine);
  require_steps_after_resume(first, o.steps, o.ckpt.resume);
  if (rank == 0 && o.explain) std::printf("%s", engine.explain_placement().c_str());

  if (rank == 0) {
    std::printf("strata train: %s\n  ZeRO stage %d, %s, world %d, micro-batch %lld x %lld, device %s\n",
                model->describe().c_str(), cfg.zero.stage, dtype_name(engine.compute_dtype()), world,
                static_cast<long long>(cfg.train_micro_batch_size_per_gpu),
                static_cast<long long>(cfg.gradient_accumulation_steps), dev->name().c_str());
    std::printf("  optimizer: %s\n", engine::describe_training(cfg).c_str());
  }
  const StepPrinting printing{.level = o.printing, .every = cfg.steps_per_print};
  for (std::int64_t s = first; s < o.steps; ++s) {
    checkpoints.stop_if_interrupted(engine, comm.get(), s, first);  // a final checkpoint first when saving
    const auto t0 = std::chrono::steady_clock::now();
    const auto r = model->step(s);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const double val = model->validate(s + 1, o.steps);
    if (rank == 0)
      report_step(s, o.steps, r, ms, val, engine.memory(), engine.io_stats(), rss_base, printing, log, o.log_json);
    checkpoints.after_step(engine, s, o.steps);
  }
  checkpoints.finish(engine);
  {
    const std::string text = model->finish();
    if (rank == 0 && !text.empty()) std::printf("sample (%zu bytes):\n%s\n", text.size(), text.c_str());
  }
  if (!o.save_params.empty()) save_params(engine, o, cfg, world);
  if (!o.trace.empty()) {
    const std::string path = world > 1 ? o.trace + ".rank" + std::to_string(rank) : o.trace;
    tracer.write(path);
    if (rank == 0) std::printf("trace: %s (open in https://ui.perfetto.dev)\n", path.c_str());
  }
  return 0;
}

}  // namespace strata::train
