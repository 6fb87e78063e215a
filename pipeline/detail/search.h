// Search over compute orders for the automatic scheduler (private to pipeline/).
#pragma once

#include <string>

#include "pipeline/detail/order_eval.h"

namespace strata::pipeline::detail {

struct Candidate {
  std::string name;
  Order order;
  OrderScore score;
};

// Hill climbing: moves one action to another place within a few positions on its stage
// (never past an action of its own kind, so F's, B's and W's keep micro-batch order) and
// keeps a move when the score improves, until a full pass finds none or the evaluator has
// run `max_evaluations` times in all.
void local_search(Candidate& c, OrderEvaluator& eval, int max_evaluations);

// BW -> B, W (1F1B's order with the backward split, W right after its B).
Order split_full_backward(const Order& order);

}  // namespace strata::pipeline::detail
