// `strata plan --model gpt|DIR ... --budget device=..,host=..[,nvme=..] [--nvme-path DIR] [--world N]
// [--batch B] [--config BASE] [--calibration FILE] [--top K] [--emit-config OUT] [--json]`:
// searches ZeRO stage, placement, micro-batch and accumulation and re-materialization for the
// highest predicted tokens/s whose estimated peaks fit the budgets (train/plan.h), and prints
// the best few with their predicted step time and peaks, and the chosen one's bytes per step
// over the link and to and from NVMe, with its NVMe writes a day at the planned speed against
// the drive's rated endurance (--drive-tbw TB). The model's training pass is
// profiled once per micro-batch and re-materialization (`strata bench gpt`, a child process);
// everything else comes from the calibration file. A budget nothing fits is refused, naming
// for each tier the smallest budget that would do.
#include <cstdio>
#include <string>

#include "runtime/core/error.h"
#include "runtime/core/units.h"
#include "tools/cli/command.h"
#include "tools/cli/flags.h"
#include "train/bench_child.h"
#include "train/llama.h"
#include "train/plan.h"

namespace strata::cli {

using namespace strata::train;  // the library these commands parse flags for
namespace {

struct Options {
  PlanOptions plan;
  int top = 5;
  bool json = false;
};

int run(const Options& opts) {
  const PlanOptions& o = opts.plan;
  const bool hf = is_hf_model_dir(o.m.model);
  // Each pass profiled by `strata bench` in a child process, as its own command measures it.
  const Plan plan = make_plan(o, [&](int micro, const std::string& remat, const std::string& products) {
    if (!opts.json) std::fprintf(stderr, "profiling the pass at micro-batch %d, remat %s\n", micro, remat.c_str());
    const auto j =
        run_self_json(str_cat(hf ? "bench llama --model " + shell_quote(o.m.model) : std::string("bench gpt"),
                              model_flags(o.m), " --micro-batch ", micro, " --remat ", remat, " --products ", products,
                              " --iters ", o.iters, " --json"),
                      "strata plan");
    return j.at("pass_s").get<double>();
  });
  if (opts.json) {
    print_json(plan.json(opts.top).dump(2));
    return 0;
  }
  const auto& fit = plan.fit;
  const Candidate& best = fit.front();
  const double tokens = plan.tokens;
  std::printf("strata plan: %zu of %zu candidates fit (batch %d sequences per rank, world %d), calibration %s (%s)\n",
              fit.size(), plan.candidates, plan.request.batch, plan.request.world, o.calibration.c_str(),
              plan.calibration.host.c_str());
  std::printf("  %-58s %8s %8s %8s %8s %8s %8s %8s %8s %10s %10s %10s\n", "candidate", "step ms", "tok/s", "compute",
              "grads", "optim", "link", "nvme", "comm", "device", "host", "nvme");
  for (std::size_t k = 0; k < fit.size() && k < static_cast<std::size_t>(opts.top); ++k) {
    const auto& c = fit[k];
    std::printf("  %-58s %8.1f %8.0f %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %10s %10s %10s\n", c.label().c_str(),
                c.time.total() * 1e3, tokens / c.time.total(), c.time.compute * 1e3, c.time.gradients * 1e3,
                c.time.optimizer * 1e3, c.time.link * 1e3, c.time.nvme * 1e3, c.time.comm * 1e3,
                format_bytes(c.device_total).c_str(), format_bytes(c.estimate.tiers[1].total()).c_str(),
                format_bytes(c.estimate.tiers[2].total()).c_str());
  }
  std::printf("chosen: %s\n%s", best.label().c_str(), best.estimate.placement.c_str());
  const Traffic t = plan.traffic(0);
  std::printf("  per step and rank: link H2D %s, D2H %s; NVMe read %s, written %s\n", format_bytes(t.h2d).c_str(),
              format_bytes(t.d2h).c_str(), format_bytes(t.nvme_read).c_str(), format_bytes(t.nvme_write).c_str());
  if (t.nvme_write > 0) {
    std::printf("  NVMe writes at %.1f ms a step: %.3f TB a day from the %d rank(s) on this host",
                best.time.total() * 1e3, t.nvme_write_per_day / 1e12, plan.request.local_ranks);
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
  add_model_options(cmd, o->plan.m);
  cmd.add_option("--budget", o->plan.budget, "Budgets per tier: device=BYTES,host=BYTES[,nvme=BYTES]")->required();
  cmd.add_option("--nvme-path", o->plan.nvme_path, "Directory on the NVMe device (lets the search use NVMe)");
  cmd.add_option("--world", o->plan.world, "Data-parallel ranks")->check(CLI::Range(1, 1 << 20));
  cmd.add_option("--local-ranks", o->plan.local_ranks,
                 "Ranks per host, sharing its cores (default: --world, as strata launch -n N runs them)")
      ->check(CLI::Range(1, 1 << 20));
  cmd.add_option("--batch", o->plan.batch,
                 "Sequences per rank per step (default: the config's micro-batch x "
                 "accumulation, else 8)")
      ->check(CLI::Range(1, 1 << 20));
  cmd.footer(kConfigHelpFooter);
  cmd.add_option("--config", o->plan.config,
                 "Base config (optimizer, precision, schedule): its placement keys are searched");
  cmd.add_option("--calibration", o->plan.calibration,
                 "File from strata bench calibrate (default strata-calibration.json)");
  cmd.add_option("--top", o->top, "Candidates to print (default 5)")->check(CLI::Range(1, 1 << 20));
  cmd.add_option("--iters", o->plan.iters, "Profiled passes per micro-batch (median; default 5)")
      ->check(CLI::Range(1, 100));
  cmd.add_option("--emit-config", o->plan.emit,
                 "Write the chosen candidate's config (runnable with strata train --config)");
  cmd.add_option("--drive-tbw", o->plan.drive_tbw,
                 "The NVMe drive's rated endurance in terabytes written: how long it lasts at the planned rate")
      ->check(CLI::PositiveNumber);
  cmd.add_flag("--json", o->json, "Print one JSON object");
  return [o, &cmd] {
    check_model_flags(cmd, o->plan.m.model);
    return run(*o);
  };
}

const Registration reg("", "plan", "Search stage, placement, micro-batch and remat for the fastest run within budgets",
                       setup);

}  // namespace
}  // namespace strata::cli
