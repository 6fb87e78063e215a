// Runs one function per rank on threads, each with its own Gloo communicator over loopback
// and a fresh rendezvous directory. Catch2 assertions are not thread-safe, so rank bodies
// return or throw; run_thread_ranks rethrows the first rank's failure in the caller.
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <vector>

#include "runtime/comm/communicator.h"

namespace strata::test {

struct RankOutcome {
  std::exception_ptr error;  // null when the rank's body returned
  double seconds = 0;        // time the body took
};

// Ranks in `absent` never start (for rendezvous tests).
std::vector<RankOutcome> run_thread_ranks(int world, std::function<void(comm::Communicator&)> body,
                                          std::chrono::milliseconds timeout = std::chrono::milliseconds(20000),
                                          std::vector<int> absent = {});

// The same, handing each rank its rendezvous options too (to create a second communicator
// over the same directory with another run_id).
std::vector<RankOutcome> run_thread_ranks_with(int world,
                                               std::function<void(comm::Communicator&, const comm::CommOptions&)> body,
                                               std::chrono::milliseconds timeout = std::chrono::milliseconds(20000),
                                               std::vector<int> absent = {});

// Rethrows the first failure of a run.
void rethrow_first(const std::vector<RankOutcome>& outcomes);

}  // namespace strata::test
