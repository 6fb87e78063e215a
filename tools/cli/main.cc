// `strata` entry point: builds the command tree from the registry, parses, runs the chosen
// command and turns a strata::Error into one clear line on stderr and exit code 1 (128 + the
// signal when a signal stopped the command).
#include <algorithm>
#include <cstdio>
#include <map>
#include <new>

#include "runtime/core/error.h"
#include "runtime/core/host_memory.h"
#include "runtime/core/log.h"
#include "runtime/core/units.h"
#include "tools/cli/command.h"
#include "train/interrupt.h"

namespace {
// 1, or 128 + the signal when the command stopped because of one (130 SIGINT, 143 SIGTERM).
int failure_code() {
  const int sig = strata::train::interrupt_signal();
  return sig != 0 ? 128 + sig : 1;
}
}  // namespace

int main(int argc, char** argv) {
  using namespace strata;
  CLI::App app{"strata: train models larger than GPU memory (ZeRO 0-3, GPU/pinned/NVMe tiers)", "strata"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "strata 0.1.0");
  std::string level;
  app.add_option("--log-level", level, "error|warn|info|debug (default: $STRATA_LOG_LEVEL or info)");

  auto specs = cli::command_registry();
  std::stable_sort(specs.begin(), specs.end(), [](const auto& a, const auto& b) {
    return a.parent.size() < b.parent.size() || (a.parent.size() == b.parent.size() && a.name < b.name);
  });
  std::map<std::string, CLI::App*> groups;
  std::map<CLI::App*, cli::Action> actions;
  for (const auto& spec : specs) {
    CLI::App* parent = &app;
    if (!spec.parent.empty()) {
      auto it = groups.find(spec.parent);
      if (it == groups.end()) {
        CLI::App* g = app.add_subcommand(
            spec.parent, spec.parent == "bench"        ? "Measure this machine (device, io, adam, comm)"
                         : spec.parent == "checkpoint" ? "Inspect and verify checkpoints (strata train --save-dir)"
                                                       : spec.parent);
        g->require_subcommand(1);
        it = groups.emplace(spec.parent, g).first;
      }
      parent = it->second;
    }
    CLI::App* cmd = parent->add_subcommand(spec.name, spec.help);
    actions[cmd] = spec.setup(*cmd);
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  CLI::App* ran = nullptr;  // the command that ran (for --explain in its errors)
  try {
    if (!level.empty()) set_log_level(parse_log_level(level));
    for (auto& [cmd, action] : actions) {
      if (cmd->parsed()) {
        ran = cmd;
        return action();
      }
    }
    std::fprintf(stderr, "strata: no command given; see strata --help\n");
    return 2;
  } catch (const Error& e) {
    // A message that leads with the fix ("raise X to at least N. Why: ...") prints the fix on its
    // own line; the reasons follow on an indented line, behind --explain where the command has it.
    std::string text = e.what();
    if (const auto why = text.find(" Why: "); why != std::string::npos) {
      const CLI::Option* explain = ran != nullptr ? ran->get_option_no_throw("--explain") : nullptr;
      if (explain != nullptr && explain->count() == 0) {
        text = text.substr(0, why) + "\n  (--explain says why)";
      } else {
        text.replace(why, 6, "\n  why: ");
      }
    }
    std::fprintf(stderr, "strata: error: %s\n", text.c_str());
    if (log_level() >= LogLevel::debug)
      std::fprintf(stderr, "strata: (%s at %s)\n", errc_name(e.code()), e.where().c_str());
    return failure_code();
  } catch (const std::bad_alloc&) {
    // Strata's own allocations name themselves (tier, bytes, what); this is one that did not.
    const HostMemory have = host_memory_available();
    std::fprintf(stderr,
                 "strata: error: out of host memory: an allocation failed (std::bad_alloc) with %s available (%s). "
                 "Use a smaller model or batch, or move state to NVMe (offload_optimizer/offload_param)\n",
                 format_bytes(have.available).c_str(), have.source.c_str());
    return failure_code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "strata: error: %s\n", e.what());
    return failure_code();
  }
}
