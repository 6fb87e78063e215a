// `strata schedule`: generates (or loads) a pipeline schedule, validates and simulates it,
// prints makespan, bubble rate and peak activations (text or --json), and draws it:
// --svg (a timeline like the papers' figures), --trace (Chrome trace JSON for Perfetto).
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "pipeline/generators.h"
#include "pipeline/simulate.h"
#include "runtime/core/error.h"
#include "tools/cli/command.h"

namespace strata::cli {
namespace {

struct Options {
  std::string kind = "1f1b";
  int stages = 4;
  int micro = 8;
  int chunks = 1;
  std::string times = "1,1,1,0";
  double mem_limit = 0;  // 0: p
  bool json = false;
  bool print = false;
  std::string trace, svg, save, load;
};

std::vector<double> parse_times(const std::string& text) {
  std::vector<double> v;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      std::size_t used = 0;
      v.push_back(std::stod(item, &used));
      STRATA_CHECK(used == item.size(), Errc::invalid_argument, "");
    } catch (const std::exception&) {
      STRATA_THROW(Errc::invalid_argument, "--times '", text, "': '", item, "' is not a number; write F,B,W[,comm]");
    }
  }
  STRATA_CHECK(v.size() == 3 || v.size() == 4, Errc::invalid_argument, "--times '", text,
               "' needs 3 or 4 numbers: F,B,W[,comm]");
  if (v.size() == 3) v.push_back(0);
  return v;
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  STRATA_CHECK(f.good(), Errc::io, "--load '", path, "' cannot be read: ", errno_text(errno));
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

std::string percent(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f%%", 100 * x);
  return buf;
}

int run(const Options& o, bool mem_limit_given) {
  const auto t = parse_times(o.times);
  const pipeline::Costs costs = pipeline::Costs::uniform(t[0], t[1], t[2], t[3]);
  pipeline::Schedule sched;
  pipeline::AutoReport report;
  const double limit = mem_limit_given ? o.mem_limit : 0;
  if (!o.load.empty()) {
    sched = pipeline::parse_schedule(read_text(o.load));
  } else {
    pipeline::GenerateOptions g;
    g.kind = pipeline::parse_schedule_kind(o.kind);
    g.stages = o.stages;
    g.micro_batches = o.micro;
    g.chunks = o.chunks;
    g.costs = costs;
    if (mem_limit_given) g.memory_limit = {o.mem_limit};
    sched = pipeline::generate(g, &report);
  }
  const pipeline::SimResult sim = pipeline::simulate(sched, costs);
  const auto& st = sim.stats;
  if (mem_limit_given) {
    for (int s = 0; s < sched.stages; ++s) {
      STRATA_CHECK(st.peak_activations[s] <= limit + 1e-9, Errc::invalid_argument, sched.kind, " keeps ",
                   st.peak_activations[s], " micro-batches of activations on stage ", s, ", above --mem-limit ", limit,
                   ": raise the limit or use zb-auto, which schedules within it");
    }
  }
  if (!o.save.empty()) {
    const bool csv = o.save.size() > 4 && o.save.substr(o.save.size() - 4) == ".csv";
    pipeline::write_file(o.save, csv ? pipeline::to_csv(sched) : pipeline::to_text(sched));
  }
  pipeline::Timeline timeline = sim.timeline;
  const std::string title = str_cat(sched.kind, "   p=", sched.stages, "  m=", sched.micro_batches,
                                    sched.chunks > 1 ? str_cat("  v=", sched.chunks) : std::string(), "   F=", t[0],
                                    " B=", t[1], " W=", t[2], t[3] > 0 ? str_cat(" comm=", t[3]) : std::string(),
                                    "   makespan ", st.makespan, "   bubble ", percent(st.bubble_rate));
  if (!o.svg.empty()) pipeline::write_file(o.svg, pipeline::to_svg(timeline, title));
  if (!o.trace.empty()) pipeline::write_file(o.trace, pipeline::to_chrome_trace(timeline));

  const double effective_limit = mem_limit_given ? limit : sched.stages;
  if (o.json) {
    nlohmann::json j = {{"kind", sched.kind},
                        {"stages", sched.stages},
                        {"micro_batches", sched.micro_batches},
                        {"chunks", sched.chunks},
                        {"times", {{"F", t[0]}, {"B", t[1]}, {"W", t[2]}, {"comm", t[3]}}},
                        {"mem_limit", effective_limit},
                        {"makespan", st.makespan},
                        {"ideal", sim.ideal},
                        {"bubble_rate", st.bubble_rate},
                        {"bubble_rate_per_stage", st.bubble_rate_per_stage},
                        {"peak_activations", st.peak_activations},
                        {"span", st.span},
                        {"busy", st.busy},
                        {"actions", sched.compute_count()}};
    if (sched.kind == "zb-auto") {
      j["auto"] = {{"winner", report.winner},
                   {"heuristic_makespan", report.heuristic_makespan},
                   {"evaluations", report.evaluations}};
    }
    print_json(j.dump(2));
  } else {
    std::printf("schedule %s: p=%d m=%d v=%d, F=%g B=%g W=%g comm=%g\n", sched.kind.c_str(), sched.stages,
                sched.micro_batches, sched.chunks, t[0], t[1], t[2], t[3]);
    if (sched.kind == "zb-auto")
      std::printf("auto: %s (heuristic alone %g, %d evaluations), memory limit %g\n", report.winner.c_str(),
                  report.heuristic_makespan, report.evaluations, effective_limit);
    std::printf("makespan     %g (ideal %g)\n", st.makespan, sim.ideal);
    std::printf("bubble rate  %s\n", percent(st.bubble_rate).c_str());
    std::printf("stage   span      busy      bubble    peak activations\n");
    for (int s = 0; s < sched.stages; ++s) {
      std::printf("%-7d %-9g %-9g %-9s %g\n", s, st.span[s], st.busy[s], percent(st.bubble_rate_per_stage[s]).c_str(),
                  st.peak_activations[s]);
    }
  }
  if (o.print) std::fputs(pipeline::to_text(sched).c_str(), stdout);
  return 0;
}

Action setup(CLI::App& cmd) {
  auto o = std::make_shared<Options>();
  auto* mem = cmd.add_option("--mem-limit", o->mem_limit,
                             "Activation memory limit per stage, in micro-batches (default p, 1F1B's peak); "
                             "zb-auto schedules within it, other kinds are checked against it");
  cmd.add_option("--kind", o->kind, "gpipe|1f1b|interleaved|zb-h1|zb-h2|zb-auto");
  cmd.add_option("--stages,-p", o->stages, "Pipeline stages p")->check(CLI::Range(1, 4096));
  cmd.add_option("--micro,-m", o->micro, "Micro-batches m")->check(CLI::Range(1, 1 << 20));
  cmd.add_option("--chunks,-v", o->chunks, "Model chunks per stage (interleaved)")->check(CLI::Range(1, 64));
  cmd.add_option("--times", o->times, "F,B,W[,comm] times (default 1,1,1,0)");
  cmd.add_flag("--json", o->json, "Print JSON");
  cmd.add_flag("--print", o->print, "Print the schedule (text form)");
  cmd.add_option("--trace", o->trace, "Write a Chrome trace (Perfetto) of the simulated run");
  cmd.add_option("--svg", o->svg, "Write the timeline as SVG");
  cmd.add_option("--save", o->save, "Write the schedule (text; CSV when the name ends in .csv)");
  cmd.add_option("--load", o->load, "Simulate a saved schedule instead of generating one");
  return [o, mem] { return run(*o, mem->count() > 0); };
}

const Registration reg("", "schedule", "Generate, check, simulate and draw a pipeline schedule", setup);

}  // namespace
}  // namespace strata::cli
