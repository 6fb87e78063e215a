// StepBet: what the overlapped optimizer step speculates on, a value StepScalars makes and
// OverlappedStep runs on: the plan of a step that neither overflows nor clips (its gradient
// scale, the optimizer's arguments for it, the next learning rate) and the squared norm, in the
// accumulators' scale, above which this rank's part of it already overflows the bet (the
// global sum can only be larger).
#pragma once

#include <limits>

#include "optim/step_args.h"

namespace strata::engine {

struct StepBet {
  float grad_scale = 0.0f;                                         // the plan's grad_scale at clip coefficient 1
  optim::StepArgs args;                                            // the optimizer's arguments for that plan
  float lr = 0.0f;                                                 // the step's learning rate
  double abandon_above = std::numeric_limits<double>::infinity();  // no clipping: only non-finite norms lose
};

}  // namespace strata::engine
