// Replays a schedule in time as the executor runs it (private to pipeline/): each stage
// works through its list; a send completes at once (posted, never blocking); a receive
// blocks until its send has happened, plus the communication delay; compute actions take
// their cost. Used by the validator (zero costs, for the deadlock check) and the simulator.
#pragma once

#include <string>

#include "pipeline/costs.h"
#include "pipeline/schedule.h"
#include "pipeline/timeline.h"

namespace strata::pipeline::detail {

// `s` must have passed the static checks (ranges, counts, pairing). Fills `out` with every
// action's start and end. Returns "" or a description of the deadlock (the action each
// unfinished stage is stuck at).
std::string replay(const Schedule& s, const Costs& costs, Timeline& out);

}  // namespace strata::pipeline::detail
