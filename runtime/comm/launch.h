// Starts N local ranks of a command, like torchrun: each gets STRATA_RANK, STRATA_WORLD_SIZE,
// STRATA_LOCAL_RANK, STRATA_RENDEZVOUS (a fresh directory for this run) and STRATA_RUN_ID.
// On several nodes, one launcher per node with the same nnodes, run_id and a rendezvous
// directory on a filesystem every node shares; node k's ranks are k*N .. k*N+N-1 (the file
// store replaces torchrun's master address and port).
// Output lines are prefixed with the rank; SIGINT/SIGTERM are forwarded; when a rank fails
// the others get `grace` to report their own errors, then SIGTERM, then SIGKILL, and the
// result names the first rank that failed.
#pragma once

#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace strata::comm {

struct LaunchOptions {
  int nprocs = 1;
  std::vector<std::string> command;  // argv; command[0] is looked up in PATH
  std::string rendezvous_dir;        // base directory; empty: $TMPDIR or /tmp (one node only)
  int nnodes = 1;                    // nodes, each running one launcher
  int node_rank = 0;                 // this node, 0 .. nnodes-1
  std::string run_id;                // the same on every node; empty: made up (one node only)
  bool prefix_output = true;         // "[rank r] " before each line
  int only_rank_output = -1;         // forward only this rank's output (-1: all)
  bool capture = false;              // keep each rank's output in the result
  std::chrono::milliseconds grace{5000};
  std::vector<std::pair<std::string, std::string>> env;  // extra environment for every rank
};

struct RankExit {
  int rank = 0;
  int pid = 0;
  int exit_code = 0;  // when exited normally
  int signal = 0;     // when killed by a signal
  bool terminated_by_launcher = false;
  std::string output;  // with capture
};

struct LaunchResult {
  int exit_code = 0;     // 0 when every rank exited 0
  int failed_rank = -1;  // first rank that failed
  std::string summary;   // "rank 2 (pid 1234) was killed by signal 9 (SIGKILL)"
  std::vector<RankExit> ranks;
};

LaunchResult launch_local(const LaunchOptions& options);

}  // namespace strata::comm
