// The simulator (see simulate.h): validation, then the replay with real costs.
#include "pipeline/simulate.h"

#include <algorithm>

#include "pipeline/detail/replay.h"
#include "runtime/core/error.h"

namespace strata::pipeline {

SimResult simulate(const Schedule& s, const Costs& costs) {
  check_valid(s);
  costs.check(s.stages);
  SimResult r;
  const std::string stuck = detail::replay(s, costs, r.timeline);
  STRATA_CHECK(stuck.empty(), Errc::internal, "simulate: a validated schedule deadlocked: ", stuck);
  r.stats = summarize(r.timeline);
  r.ideal = *std::max_element(r.stats.busy.begin(), r.stats.busy.end());
  return r;
}

}  // namespace strata::pipeline
