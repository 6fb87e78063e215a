// Shared pieces of the comm tests: exactly representable rank values, a checked
// collective suite every world size and transport runs, and the process-rank runner.
#pragma once

#include <string>
#include <vector>

#include "runtime/comm/communicator.h"
#include "runtime/comm/launch.h"

namespace strata::test {

// Every collective, every root, uneven counts, p2p ring and barrier, on `t`; throws on the
// first wrong element (naming op, rank, index, got and expected).
void run_collective_suite(comm::Communicator& c, DType t);

// Launches `world` processes of this test binary running the hidden worker test for
// `scenario` (see worker.cc) and returns the launcher's result, capturing output.
comm::LaunchResult run_process_ranks(int world, const std::string& scenario, int grace_ms = 10000);

}  // namespace strata::test
