// `strata estimate --model mlp|gpt --config FILE.json [--world N]`: the peak bytes one rank
// of `strata train` with the same flags will hold on each tier (device, host, NVMe) and per
// kind (parameters, gradients, optimizer state, buffers), and the model's own device memory
// (GPT activations), computed without allocating the model (engine/memory_estimate.h), with
// DeepSpeed's estimator beside it, and the process RSS the rank will peak at (rss_estimate.h;
// --data names the GPT's training text, whose tokens it holds). A budget nothing fits is refused, naming the smallest
// that would. --json prints the same as one object. --lora-rank sizes a LoRA fine-tune of the
// model (lora_estimate.h): its base frozen, adapters trainable, and prints what full
// fine-tuning of the same model would hold beside it.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/config.h"
#include "engine/memory_estimate.h"
#include "runtime/core/error.h"
#include "runtime/core/host_memory.h"
#include "runtime/core/units.h"
#include "tools/cli/command.h"
#include "tools/cli/flags.h"
#include "train/lora_estimate.h"
#include "train/model.h"
#include "train/rss_estimate.h"

namespace strata::cli {

using namespace strata::train;  // the library these commands parse flags for
namespace {

struct Options {
  ModelOptions m;
  std::string config;
  int world = 1;
  std::string device = "host";
  std::string device_budget = "1GiB";
  bool json = false;
  int lora_rank = 0;  // 0: full fine-tuning
  std::vector<std::string> lora_targets{"q_proj", "v_proj"};
};

// DeepSpeed's model-state estimator for the same run (Psi parameters, L in the largest layer,
// g ranks on the node, one node; buffer factor 1.5): per GPU and CPU bytes, as its
// estimate_zero{2,3}_model_states_mem_needs functions compute them. It counts neither NVMe
// nor activations; stage 0 has no estimator there (plain data parallelism: 18 B a parameter).
struct DeepSpeedFigure {
  std::string formula;
  double gpu = 0, cpu = 0;
};

DeepSpeedFigure deepspeed_figure(const engine::EngineConfig& c, double psi, double largest, int g) {
  const double f = 1.5;
  const bool opt_off = c.offload_optimizer.device != engine::OffloadDevice::none;
  const bool par_off = c.offload_param.device != engine::OffloadDevice::none;
  if (c.zero.stage == 0) return {"stage 0: 18 B per parameter on the GPU", 18 * psi, 0};
  if (c.zero.stage <= 2) {
    if (opt_off)
      return {"ZeRO-2, optimizer offloaded: GPU 2Psi, CPU Psi*max(4g,16)*1.5", 2 * psi,
              psi * std::max(4.0 * g, 16.0) * f};
    return {"ZeRO-2: GPU 4Psi + 16Psi/g, CPU 4Psi*g*1.5", 4 * psi + 16 * psi / g, 4 * psi * g * f};
  }
  if (opt_off && par_off)
    return {"ZeRO-3, parameters and optimizer offloaded: GPU 4L, CPU 18Psi*1.5", 4 * largest, 18 * psi * f};
  if (opt_off)
    return {"ZeRO-3, optimizer offloaded: GPU 4L + 2Psi/g, CPU Psi*max(4g,16)*1.5", 4 * largest + 2 * psi / g,
            psi * std::max(4.0 * g, 16.0) * f};
  return {"ZeRO-3: GPU 4L + 18Psi/g, CPU 4Psi*g*1.5", 4 * largest + 18 * psi / g, 4 * psi * g * f};
}

nlohmann::json tier_json(const engine::TierEstimate& t) {
  nlohmann::json j;
  for (int k = 0; k < engine::kKinds; ++k) j[engine::kind_name(static_cast<engine::Kind>(k))] = t.kind[k];
  j["total"] = t.total();
  return j;
}

nlohmann::json rss_json(const RssEstimate& r) {
  return {{"base_bytes", r.base},     {"runtime_bytes", r.runtime}, {"trainer_bytes", r.trainer},
          {"engine_bytes", r.engine}, {"device_bytes", r.device},   {"peak_bytes", r.peak()}};
}

int run(const Options& o) {
  RssEstimate rss;
  rss.base = process_rss_bytes();  // where strata train reads its own: nothing set up yet
  STRATA_CHECK(o.world >= 1, Errc::invalid_argument, "--world ", o.world, " must be >= 1");
  STRATA_CHECK(o.device == "host" || o.device == "cuda", Errc::invalid_argument, "--device ", o.device,
               " is not available: use host or cuda");
  engine::ModelFacts facts;
  facts.world_size = o.world;
  facts.total_steps = 1;
  facts.hidden_size = model_hidden_size(o.m);
  engine::EstimateInput in;
  in.config = engine::load_config(o.config, facts);
  const ModelSize model = model_size(o.m, in.config, o.device == "cuda");
  in.params = model.params;
  in.world = o.world;
  in.device_budget =
      in.config.memory_budget.device ? in.config.memory_budget.device : parse_bytes(o.device_budget, "--device-budget");
  in.trainer_device_bytes = model.device_bytes;
  in.device_in_host_ram = o.device == "host";
  in.device_collectives = o.device == "cuda" && o.world > 1;  // strata train adds NCCL there
  STRATA_CHECK(model.min_device_bytes <= in.device_budget, Errc::out_of_budget, "device budget ",
               format_bytes(in.device_budget), ": raise memory_budget.device (or --device-budget) to at least ",
               model.min_device_bytes, " B (", format_bytes(model.min_device_bytes), "). Why: it is below what ",
               model.describe,
               " needs on the device itself: activations, and one block gathered with its gradient "
               "buffer");
  LoraShape lora;
  std::array<std::uint64_t, engine::kTiers> full{};  // full fine-tuning's tiers, beside LoRA's
  if (o.lora_rank > 0) {
    lora = add_lora(in.params, o.lora_rank, o.lora_targets);
    auto all = in;
    all.params = model.params;
    try {
      const auto f = engine::estimate_memory(all);
      for (int t = 0; t < engine::kTiers; ++t) full[t] = f.tiers[t].total();
    } catch (const Error&) {
      // Full fine-tuning does not fit these budgets: nothing to print beside LoRA's.
    }
  }
  const engine::MemoryEstimate e = engine::estimate_memory(in);  // refuses a budget nothing fits

  const DeepSpeedFigure ds =
      deepspeed_figure(in.config, static_cast<double>(e.params), static_cast<double>(e.largest_layer_params), o.world);
  const std::uint64_t device_total = e.tiers[0].total() + e.trainer_device_bytes;
  rss.runtime = measure_runtime_rss(o.m, in.config);
  rss.trainer = trainer_host_bytes(o.m, in.config);
  rss.engine = e.tiers[1].total() + e.swap_file_host_bytes;
  rss.device = in.device_in_host_ram ? device_total : 0;
  const auto per_param = [&](std::uint64_t bytes) {
    return e.params > 0 ? static_cast<double>(bytes) / static_cast<double>(e.params) : 0.0;
  };
  if (o.json) {
    nlohmann::json j{{"model", model.describe},
                     {"parameters", e.params},
                     {"stage", in.config.zero.stage},
                     {"world", o.world},
                     {"compute_dtype", dtype_name(engine::compute_dtype_of(in.config))},
                     {"device_budget", in.device_budget},
                     {"trainer_device_bytes", e.trainer_device_bytes},
                     {"device_total", device_total},
                     {"rss", rss_json(rss)},
                     {"deepspeed", {{"formula", ds.formula}, {"gpu_bytes", ds.gpu}, {"cpu_bytes", ds.cpu}}}};
    for (int t = 0; t < engine::kTiers; ++t) {
      const char* name = engine::tier_name(static_cast<engine::Tier>(t));
      j["tiers"][name] = tier_json(e.tiers[t]);
      j["tiers"][name]["bytes_per_parameter"] = per_param(e.tiers[t].total());
    }
    j["optimizer_state"] = {{"moment_dtype", moment_format_name(in.config.optimizer.moment_format)},
                            {"bytes_per_element", engine::state_bytes_per_elem(in.config.optimizer)}};
    if (o.lora_rank > 0) {
      j["lora"] = {{"rank", o.lora_rank},       {"adapted_weights", lora.adapted}, {"trainable", lora.trainable},
                   {"frozen", lora.frozen},     {"full_device_total", full[0]},    {"full_host_total", full[1]},
                   {"full_nvme_total", full[2]}};
    }
    print_json(j.dump());
    return 0;
  }
  std::printf("strata estimate: %s, %llu parameters; ZeRO stage %d, %s, world %d (peak bytes of one rank)\n",
              model.describe.c_str(), static_cast<unsigned long long>(e.params), in.config.zero.stage,
              dtype_name(engine::compute_dtype_of(in.config)), o.world);
  std::printf("  %-8s %12s %12s %12s %12s %12s\n", "tier", "params", "grads", "optimizer", "buffers", "total");
  for (int t = 0; t < engine::kTiers; ++t) {
    const auto& k = e.tiers[t].kind;
    std::printf("  %-8s %12s %12s %12s %12s %12s\n", engine::tier_name(static_cast<engine::Tier>(t)),
                format_bytes(k[0]).c_str(), format_bytes(k[1]).c_str(), format_bytes(k[2]).c_str(),
                format_bytes(k[3]).c_str(), format_bytes(e.tiers[t].total()).c_str());
  }
  std::printf("  bytes per parameter: device %.2f, host %.2f, nvme %.2f; optimizer state %g bytes an element (%s)\n",
              per_param(e.tiers[0].total()), per_param(e.tiers[1].total()), per_param(e.tiers[2].total()),
              engine::state_bytes_per_elem(in.config.optimizer),
              engine::state_description(in.config.optimizer).c_str());
  std::printf("  the model's own device memory (activations, temporaries): %s; device total %s of budget %s\n",
              format_bytes(e.trainer_device_bytes).c_str(), format_bytes(device_total).c_str(),
              format_bytes(in.device_budget).c_str());
  std::printf(
      "  process RSS peak %s: this executable %s, libraries' first use %s, the trainer's host arrays %s, the "
      "engine's host tier %s%s\n",
      format_bytes(rss.peak()).c_str(), format_bytes(rss.base).c_str(), format_bytes(rss.runtime).c_str(),
      format_bytes(rss.trainer).c_str(), format_bytes(rss.engine).c_str(),
      rss.device ? str_cat(", the host device's memory ", format_bytes(rss.device)).c_str() : "");
  std::printf("DeepSpeed's estimator (%s; no NVMe, no activations): GPU %s, CPU %s\n", ds.formula.c_str(),
              format_bytes(static_cast<std::uint64_t>(ds.gpu)).c_str(),
              format_bytes(static_cast<std::uint64_t>(ds.cpu)).c_str());
  if (o.lora_rank > 0) {
    std::printf(
        "LoRA rank %d on %llu weights: %llu trainable parameters (%.3f%% of the model's %llu, frozen in the "
        "compute dtype with no gradient or optimizer state)\n",
        o.lora_rank, static_cast<unsigned long long>(lora.adapted), static_cast<unsigned long long>(lora.trainable),
        100.0 * static_cast<double>(lora.trainable) / static_cast<double>(lora.frozen),
        static_cast<unsigned long long>(lora.frozen));
    if (full[0] + full[1] + full[2] > 0)
      std::printf("  full fine-tuning with the same config would hold: device %s, host %s, nvme %s\n",
                  format_bytes(full[0]).c_str(), format_bytes(full[1]).c_str(), format_bytes(full[2]).c_str());
    else
      std::printf("  full fine-tuning does not fit these budgets\n");
  }
  std::printf("%s", e.placement.c_str());
  return 0;
}

Action setup(CLI::App& cmd) {
  auto o = std::make_shared<Options>();
  auto& m = o->m;
  cmd.footer(kConfigHelpFooter);
  cmd.add_option("--config", o->config, "DeepSpeed-style JSON config (as for strata train)")->required();
  add_model_options(cmd, m);
  cmd.add_option("--data", m.data, "GPT training text as for strata train (its tokens count in the process RSS)");
  cmd.add_option("--world", o->world, "Data-parallel ranks (strata launch -n N)")->check(CLI::Range(1, 1 << 20));
  cmd.add_option("--device", o->device, "host (the emulated device) or cuda (GPUs; NCCL between ranks)");
  cmd.add_option("--device-budget", o->device_budget,
                 "Device memory budget when the config has no memory_budget.device (default 1GiB)");
  cmd.add_flag("--json", o->json, "Print one JSON object");
  cmd.add_option("--lora-rank", o->lora_rank,
                 "Size a LoRA fine-tune: the model frozen, adapters of this rank on the --lora-targets weights")
      ->check(CLI::Range(1, 1 << 16));
  cmd.add_option("--lora-targets", o->lora_targets,
                 "Weights given adapters: those whose names hold one of these (default q_proj v_proj)")
      ->delimiter(',');
  return [o, &cmd] {
    check_model_flags(cmd, o->m.model);
    return run(*o);
  };
}

const Registration reg("", "estimate", "Predict the peak memory per tier of a strata train run, allocating nothing",
                       setup);

}  // namespace
}  // namespace strata::cli
