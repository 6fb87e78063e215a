// The validator and the simulator. validate() checks that a schedule can run: shapes,
// counts (one F per micro-batch and chunk, and either B and W or BW), order on each stage
// (F before B before W, OPT last), that every remote dependency has exactly one send after
// its producer and one receive before its consumer with matching peers, and -- by
// replaying it with sends that never block and receives that do, as the executor runs --
// that it cannot deadlock. simulate() times a valid schedule under Costs.
#pragma once

#include <string>
#include <vector>

#include "pipeline/costs.h"
#include "pipeline/schedule.h"
#include "pipeline/timeline.h"

namespace strata::pipeline {

struct ValidationReport {
  std::vector<std::string> errors;  // empty when valid; at most 20 are kept
  bool ok() const noexcept { return errors.empty(); }
  std::string summary() const;  // the errors, one per line
};

ValidationReport validate(const Schedule& s);
// Throws Errc::invalid_argument with the report's first errors when `s` is not valid.
void check_valid(const Schedule& s);

struct SimResult {
  Timeline timeline;  // every action, comm and OPT included
  TimelineStats stats;
  double ideal = 0;  // max over stages of busy time: the makespan with no bubble
};

// Validates, then times: a stage runs its actions in order, each starting when the stage
// is free; a receive waits until the matching send's time plus costs.comm; a chunk's F, B,
// W take the stage's time / chunks, BW takes B + W, OPT costs.optimizer.
SimResult simulate(const Schedule& s, const Costs& costs);

}  // namespace strata::pipeline
