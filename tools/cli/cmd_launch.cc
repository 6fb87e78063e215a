// `strata launch -n N [--rendezvous DIR] [--nnodes M --node-rank K --run-id ID] -- CMD ARGS...`:
// N local ranks of CMD with the rendezvous environment set; exits non-zero naming the first
// rank that failed. Several nodes: one launcher per node, a shared --rendezvous directory.
#include <algorithm>
#include <cstdio>

#include "runtime/comm/launch.h"
#include "tools/cli/command.h"

namespace strata::cli {
namespace {

struct Options {
  comm::LaunchOptions launch;
  int grace_ms = 5000;
  bool no_prefix = false;
};

Action setup(CLI::App& cmd) {
  auto o = std::make_shared<Options>();
  cmd.add_option("-n,--nprocs", o->launch.nprocs, "Number of ranks")->required()->check(CLI::Range(1, 4096));
  cmd.add_option("--rendezvous", o->launch.rendezvous_dir, "Directory for the file store (default: $TMPDIR or /tmp)");
  cmd.add_option("--nnodes", o->launch.nnodes, "Nodes, each running one launcher with the same --run-id")
      ->check(CLI::Range(1, 4096));
  cmd.add_option("--node-rank", o->launch.node_rank, "This node (0 .. nnodes-1): its ranks are K*N .. K*N+N-1")
      ->check(CLI::NonNegativeNumber);
  cmd.add_option("--run-id", o->launch.run_id,
                 "Names the run in the rendezvous directory; the same on every node (e.g. $SLURM_JOB_ID)");
  cmd.add_option("--grace-ms", o->grace_ms, "After a rank fails, time the others get before SIGTERM")
      ->check(CLI::NonNegativeNumber);
  cmd.add_flag("--no-prefix", o->no_prefix,
               "Do not prefix output lines with [rank r] (a command given --json is never prefixed: its output "
               "stays JSON)");
  cmd.add_option("command", o->launch.command, "Command and arguments (after --)")->required();
  return [o] {
    o->launch.grace = std::chrono::milliseconds(o->grace_ms);
    // JSON from rank 0 (the commands that take --json print it there only) stays parseable.
    const auto& c = o->launch.command;
    o->launch.prefix_output = !o->no_prefix && std::find(c.begin(), c.end(), "--json") == c.end();
    const auto result = comm::launch_local(o->launch);
    if (result.exit_code != 0) {
      std::fprintf(stderr, "strata launch: failed: %s\n", result.summary.c_str());
    }
    return result.exit_code;
  };
}

const Registration reg("", "launch", "Start N local ranks of a command (like torchrun)", setup);

}  // namespace
}  // namespace strata::cli
