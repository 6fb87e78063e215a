// `strata plan --model gpt|DIR ... --budget device=..,host=..[,nvme=..] [--nvme-path DIR] [--world N]
// [--batch B] [--config BASE] [--calibration FILE] [--top K] [--emit-config OUT] [--json]`:
// searches ZeRO stage, placement, micro-batch and accumulation and re-materialization for the
// highest predicted tokens/s whose estimated peaks fit the budgets (plan_search.h), and prints
// the best few with their predicted step time and peaks, and the chosen one's bytes per step
// over the link and to and from NVMe, with its NVMe writes a day at the planned speed against
// the drive's rated endurance (--drive-tbw TB). The model's training pass is
// profiled once per micro-batch and re-materialization (`strata bench gpt`, a child process);
// everything else comes from the calibration file. A budget nothing fits is refused, naming
// for each tier the smallest budget that would do.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <set>

#include "runtime/core/error.h"
#include "runtime/core/units.h"
#include "tools/cli/bench_child.h"
#include "tools/cli/command.h"
#include "tools/cli/flags.h"
#include "train/llama.h"
#include "train/model.h"
#include "train/output_check.h"
#include "train/plan_search.h"

namespace strata::cli {

using namespace strata::train;  // the library these commands parse flags for
namespace {

struct Options {
  ModelOptions m;
  std::string budget, nvme_path, config, calibration = "strata-calibration.json", emit;
  int world = 1, local_ranks = 0, batch = 0, top = 5, iters = 5;
  double drive_tbw = 0;  // the NVMe drive's rated endurance, terabytes written (0: not given)
  bool json = false;
};

// What a candidate moves per step (one rank; the estimate's placement traffic) and, at its
// predicted step time, the NVMe bytes written a day by the ranks on this host (they share
// its drive), against the drive's rated endurance when given.
struct Traffic {
  std::uint64_t h2d = 0, d2h = 0, nvme_read = 0, nvme_write = 0;  // per step, one rank
  double nvme_write_per_day = 0;                                  // bytes, this host's ranks
  double endurance_days = 0;                                      // 0: no --drive-tbw or no writes
};

Traffic traffic_of(const Candidate& c, int local_ranks, double drive_tbw) {
  Traffic t{c.estimate.h2d_bytes, c.estimate.d2h_bytes, c.estimate.nvme_read_bytes, c.estimate.nvme_write_bytes};
  t.nvme_write_per_day = static_cast<double>(t.nvme_write) * local_ranks * 86400.0 / c.time.total();
  if (drive_tbw > 0 && t.nvme_write_per_day > 0) t.endurance_days = drive_tbw * 1e12 / t.nvme_write_per_day;
  return t;
}

void parse_budget(const std::string& text, PlanRequest& r) {
  std::set<std::string> seen;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    const std::size_t end = std::min(text.find(',', pos), text.size());
    const std::string item = text.substr(pos, end - pos);
    const std::size_t eq = item.find('=');
    STRATA_CHECK(eq != std::string::npos, Errc::invalid_argument, "--budget '", text, "': '", item,
                 "' is not TIER=BYTES (for example device=24MiB,host=40MiB,nvme=1GiB)");
    const std::string tier = item.substr(0, eq), bytes = item.substr(eq + 1);
    STRATA_CHECK(seen.insert(tier).second, Errc::invalid_argument, "--budget '", text, "': tier '", tier,
                 "' is given twice: give each tier once");
    const std::string what = "--budget " + tier;
    if (tier == "device") {
      r.device_budget = parse_bytes(bytes, what);
    } else if (tier == "host") {
      r.host_budget = parse_bytes(bytes, what);
    } else if (tier == "nvme") {
      r.nvme_budget = parse_bytes(bytes, what);
    } else {
      STRATA_THROW(Errc::invalid_argument, "--budget '", text, "': tier '", tier, "' is not device, host or nvme");
    }
    pos = end + 1;
  }
  STRATA_CHECK(seen.count("device") && seen.count("host"), Errc::invalid_argument, "--budget '", text,
               "' must give the device and the host (for example device=24MiB,host=40MiB)");
  STRATA_CHECK(r.nvme_budget == 0 || !r.nvme_path.empty(), Errc::invalid_argument,
               "--budget nvme needs --nvme-path DIR: the directory on the NVMe device for swap files");
}

nlohmann::json base_config(const Options& o) {
  if (o.config.empty()) {
    return {{"bf16", {{"enabled", true}}},
            {"gradient_clipping", 1.0},
            {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}, {"weight_decay", 0.01}}}}},
            {"zero_optimization", {{"stage3_param_persistence_threshold", 0}}}};
  }
  std::ifstream in(o.config);
  STRATA_CHECK(in.good(), Errc::io, "--config '", o.config, "' cannot be read");
  const nlohmann::json j = nlohmann::json::parse(
      std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()), nullptr, false);
  STRATA_CHECK(!j.is_discarded() && j.is_object(), Errc::invalid_argument, "--config '", o.config,
               "' is not a JSON object");
  return j;
}

std::string model_flags(const ModelOptions& m) {
  std::string f;
  if (!m.preset.empty()) f += " --preset " + m.preset;
  auto add = [&f](const char* flag, int v) {
    if (v > 0) f += str_cat(" ", flag, " ", v);
  };
  add("--layers", m.layers);
  add("--heads", m.heads);
  add("--d-model", m.d_model);
  add("--seq-len", m.seq_len);
  add("--positions", m.positions);
  add("--vocab", m.vocab);
  return f;
}

nlohmann::json candidate_json(const Candidate& c, double tokens, const Traffic& t) {
  return {{"label", c.label()},
          {"h2d_bytes_per_step", t.h2d},
          {"d2h_bytes_per_step", t.d2h},
          {"nvme_read_bytes_per_step", t.nvme_read},
          {"nvme_write_bytes_per_step", t.nvme_write},
          {"nvme_write_bytes_per_day", t.nvme_write_per_day},
          {"drive_endurance_days", t.endurance_days},
          {"stage", c.stage},
          {"optimizer", c.optimizer},
          {"params", c.params},
          {"micro_batch", c.micro},
          {"accumulation", c.accum},
          {"remat", c.remat},
          {"step_ms", c.time.total() * 1e3},
          {"tokens_per_s", tokens / c.time.total()},
          {"compute_ms", c.time.compute * 1e3},
          {"gradients_ms", c.time.gradients * 1e3},
          {"optimizer_ms", c.time.optimizer * 1e3},
          {"link_ms", c.time.link * 1e3},
          {"nvme_ms", c.time.nvme * 1e3},
          {"comm_ms", c.time.comm * 1e3},
          {"device_peak", c.device_total},
          {"host_peak", c.estimate.tiers[1].total()},
          {"nvme_peak", c.estimate.tiers[2].total()},
          {"config", c.config}};
}

int run(const Options& o) {
  const bool hf = is_hf_model_dir(o.m.model);
  STRATA_CHECK(o.m.model == "gpt" || hf, Errc::invalid_argument, "--model ", o.m.model,
               ": strata plan sizes the GPT (--model gpt) and Hugging Face directories (--model DIR); the demo MLP "
               "has no pass to profile");
  PlanRequest r;
  r.model = o.m;
  r.nvme_path = o.nvme_path;
  r.world = o.world;
  r.local_ranks = o.local_ranks > 0 ? o.local_ranks : o.world;
  STRATA_CHECK(r.local_ranks <= r.world, Errc::invalid_argument, "--local-ranks ", r.local_ranks, " is above --world ",
               r.world);
  parse_budget(o.budget, r);
  r.base = base_config(o);
  const int base_batch =
      r.base.value("train_micro_batch_size_per_gpu", 0) * r.base.value("gradient_accumulation_steps", 1);
  r.batch = o.batch > 0 ? o.batch : base_batch > 0 ? base_batch : 8;
  if (!o.emit.empty()) check_output_file("--emit-config", o.emit);
  const Calibration cal = load_calibration(o.calibration);

  std::vector<Candidate> all = plan_candidates(r);
  std::vector<Candidate> fit;
  for (auto& c : all)
    if (c.refusal.empty()) fit.push_back(std::move(c));
  if (fit.empty()) {
    const auto least = smallest_budgets(r);
    std::string what;
    const char* names[3] = {"device", "host", "nvme"};
    for (int t = 0; t < 3; ++t)
      if (least[t])
        what += str_cat(what.empty() ? "" : ", or ", names[t], "=", format_bytes(least[t]), " (", least[t], " B)");
    STRATA_THROW(Errc::out_of_budget,
                 "no stage, placement, micro-batch or re-materialization of the model fits "
                 "--budget ",
                 o.budget,
                 what.empty() ? std::string(": no budget of one tier alone makes it fit; raise several")
                              : str_cat(": raise --budget to ", what, " (the other tiers as given)"));
  }
  std::map<std::pair<int, std::string>, double> pass;  // profiled seconds per (micro, remat)
  for (auto& c : fit) {
    const auto key = std::make_pair(c.micro, c.remat);
    if (!pass.count(key)) {
      if (!o.json) std::fprintf(stderr, "profiling the pass at micro-batch %d, remat %s\n", c.micro, c.remat.c_str());
      const auto j =
          run_self_json(str_cat(hf ? "bench llama --model " + shell_quote(o.m.model) : std::string("bench gpt"),
                                model_flags(o.m), " --micro-batch ", c.micro, " --remat ", c.remat, " --products ",
                                c.compute == DType::bf16 ? "bf16" : "fp32", " --iters ", o.iters, " --json"),
                        "strata plan");
      pass[key] = j.at("pass_s").get<double>();
    }
    c.time = predict_step(cal, c, r, pass[key]);
  }
  std::stable_sort(fit.begin(), fit.end(),
                   [](const Candidate& a, const Candidate& b) { return a.time.total() < b.time.total(); });
  const Candidate& best = fit.front();
  const int seq = hf ? llama_config(o.m, false).seq_len : gpt_config(o.m, false).seq_len;
  const double tokens = static_cast<double>(r.batch) * seq * r.world;
  if (!o.emit.empty()) {
    std::ofstream f(o.emit, std::ios::trunc);
    f << best.config.dump(2) << "\n";
    f.close();
    STRATA_CHECK(f.good(), Errc::io, "--emit-config '", o.emit, "': writing failed (disk full?)");
  }
  if (o.json) {
    nlohmann::json j{{"fitting", fit.size()}, {"candidates", all.size()}, {"batch", r.batch}, {"world", r.world}};
    for (std::size_t k = 0; k < fit.size() && k < static_cast<std::size_t>(o.top); ++k)
      j["best"].push_back(candidate_json(fit[k], tokens, traffic_of(fit[k], r.local_ranks, o.drive_tbw)));
    print_json(j.dump(2));
    return 0;
  }
  std::printf("strata plan: %zu of %zu candidates fit (batch %d sequences per rank, world %d), calibration %s (%s)\n",
              fit.size(), all.size(), r.batch, r.world, o.calibration.c_str(), cal.host.c_str());
  std::printf("  %-58s %8s %8s %8s %8s %8s %8s %8s %8s %10s %10s %10s\n", "candidate", "step ms", "tok/s", "compute",
              "grads", "optim", "link", "nvme", "comm", "device", "host", "nvme");
  for (std::size_t k = 0; k < fit.size() && k < static_cast<std::size_t>(o.top); ++k) {
    const auto& c = fit[k];
    std::printf("  %-58s %8.1f %8.0f %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %10s %10s %10s\n", c.label().c_str(),
                c.time.total() * 1e3, tokens / c.time.total(), c.time.compute * 1e3, c.time.gradients * 1e3,
                c.time.optimizer * 1e3, c.time.link * 1e3, c.time.nvme * 1e3, c.time.comm * 1e3,
                format_bytes(c.device_total).c_str(), format_bytes(c.estimate.tiers[1].total()).c_str(),
                format_bytes(c.estimate.tiers[2].total()).c_str());
  }
  std::printf("chosen: %s\n%s", best.label().c_str(), best.estimate.placement.c_str());
  const Traffic t = traffic_of(best, r.local_ranks, o.drive_tbw);
  std::printf("  per step and rank: link H2D %s, D2H %s; NVMe read %s, written %s\n", format_bytes(t.h2d).c_str(),
              format_bytes(t.d2h).c_str(), format_bytes(t.nvme_read).c_str(), format_bytes(t.nvme_write).c_str());
  if (t.nvme_write > 0) {
    std::printf("  NVMe writes at %.1f ms a step: %.3f TB a day from the %d rank(s) on this host",
                best.time.total() * 1e3, t.nvme_write_per_day / 1e12, r.local_ranks);
    if (t.endurance_days > 0)
      std::printf("; a drive rated %g TBW lasts %.0f days (%.1f years) at that rate", o.drive_tbw, t.endurance_days,
                  t.endurance_days / 365.0);
    std::printf("\n");
  }
  if (!o.emit.empty())
    std::printf("wrote %s: strata train --model %s%s --remat %s --config %s ...\n", o.emit.c_str(),
                hf ? shell_quote(o.m.model).c_str() : "gpt", model_flags(o.m).c_str(), best.remat.c_str(),
                o.emit.c_str());
  return 0;
}

Action setup(CLI::App& cmd) {
  auto o = std::make_shared<Options>();
  add_model_options(cmd, o->m);
  cmd.add_option("--budget", o->budget, "Budgets per tier: device=BYTES,host=BYTES[,nvme=BYTES]")->required();
  cmd.add_option("--nvme-path", o->nvme_path, "Directory on the NVMe device (lets the search use NVMe)");
  cmd.add_option("--world", o->world, "Data-parallel ranks")->check(CLI::Range(1, 1 << 20));
  cmd.add_option("--local-ranks", o->local_ranks,
                 "Ranks per host, sharing its cores (default: --world, as strata launch -n N runs them)")
      ->check(CLI::Range(1, 1 << 20));
  cmd.add_option("--batch", o->batch,
                 "Sequences per rank per step (default: the config's micro-batch x "
                 "accumulation, else 8)")
      ->check(CLI::Range(1, 1 << 20));
  cmd.footer(kConfigHelpFooter);
  cmd.add_option("--config", o->config,
                 "Base config (optimizer, precision, schedule): its placement keys are searched");
  cmd.add_option("--calibration", o->calibration, "File from strata bench calibrate (default strata-calibration.json)");
  cmd.add_option("--top", o->top, "Candidates to print (default 5)")->check(CLI::Range(1, 1 << 20));
  cmd.add_option("--iters", o->iters, "Profiled passes per micro-batch (median; default 5)")->check(CLI::Range(1, 100));
  cmd.add_option("--emit-config", o->emit, "Write the chosen candidate's config (runnable with strata train --config)");
  cmd.add_option("--drive-tbw", o->drive_tbw,
                 "The NVMe drive's rated endurance in terabytes written: how long it lasts at the planned rate")
      ->check(CLI::PositiveNumber);
  cmd.add_flag("--json", o->json, "Print one JSON object");
  return [o, &cmd] {
    check_model_flags(cmd, o->m.model);
    return run(*o);
  };
}

const Registration reg("", "plan", "Search stage, placement, micro-batch and remat for the fastest run within budgets",
                       setup);

}  // namespace
}  // namespace strata::cli
