// A fast evaluator of single-chunk compute orders for the schedule search (private to
// pipeline/). Same timing rules as the simulator on the schedule add_communication() would
// build from the order (tests hold the two to the same makespan), without building it.
#pragma once

#include <vector>

#include "pipeline/action.h"
#include "pipeline/costs.h"

namespace strata::pipeline::detail {

using Order = std::vector<std::vector<Action>>;

struct OrderScore {
  bool feasible = false;  // no deadlock, memory within the limit on every stage
  double makespan = 0;    // longest stage span
  double spans = 0;       // sum of stage spans: a tie-breaker that rewards progress
  bool better_than(const OrderScore& o) const;
};

class OrderEvaluator {
 public:
  OrderEvaluator(int stages, int micro_batches, const Costs& costs, std::vector<double> memory_limit);
  OrderScore operator()(const Order& order);
  int evaluations() const noexcept { return evaluations_; }

 private:
  int p_, m_;
  std::vector<double> f_, b_, w_, limit_;
  double comm_;
  std::vector<double> end_f_, end_b_;
  std::vector<std::size_t> pos_;
  std::vector<double> clock_, first_;
  std::vector<int> mem_;
  int evaluations_ = 0;
};

// Memory limits, one per stage, from AutoOptions' list (empty: p); throws below 1.
std::vector<double> expand_memory_limit(const std::vector<double>& limit, int stages);

}  // namespace strata::pipeline::detail
