// The bandwidth ceiling of an optimizer step on this machine: a streaming pass with exactly
// the step's memory traffic (same buffers, same read and write streams, same bytes, the same
// streaming store for the copy-out, same block driver and threads) and no arithmetic beyond
// a bitwise touch of each element. `strata bench adam` divides the step's GB/s by this one's.
#pragma once

#include "optim/step_args.h"

namespace strata::optim {

enum class UpdateRule { adam, lion, adagrad };

StateUse state_use(UpdateRule rule) noexcept;  // adam: m and v; lion: m; adagrad: v

// Reads master, grad and the rule's state, writes master, state and the copy (if any), all
// values bit-for-bit unchanged (the copy receives the master's upper 16 bits), so it can run
// on live optimizer buffers between steps. Validates like the rule's step.
void roofline_pass(UpdateRule rule, const StepArgs& args, const StepOptions& options = {});

}  // namespace strata::optim
