// The order evaluator (see detail/order_eval.h).
#include "pipeline/detail/order_eval.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "runtime/core/error.h"

namespace strata::pipeline::detail {

bool OrderScore::better_than(const OrderScore& o) const {
  if (feasible != o.feasible) return feasible;
  const double tol = 1e-9 * std::max(1.0, std::abs(o.makespan));
  if (makespan < o.makespan - tol) return true;
  if (makespan > o.makespan + tol) return false;
  return spans < o.spans - tol;
}

std::vector<double> expand_memory_limit(const std::vector<double>& limit, int stages) {
  std::vector<double> out;
  if (limit.empty())
    out.assign(stages, static_cast<double>(stages));
  else if (limit.size() == 1)
    out.assign(stages, limit[0]);
  else {
    STRATA_CHECK(limit.size() == static_cast<std::size_t>(stages), Errc::invalid_argument,
                 "memory limit: ", limit.size(), " values for ", stages, " stages; give one value or one per stage");
    out = limit;
  }
  for (int s = 0; s < stages; ++s) {
    STRATA_CHECK(std::isfinite(out[s]) && out[s] >= 1.0, Errc::invalid_argument, "memory limit ", out[s], " on stage ",
                 s,
                 " is below one micro-batch of activations: a stage must hold at least one "
                 "micro-batch (--mem-limit counts one micro-batch's activations as 1)");
  }
  return out;
}

OrderEvaluator::OrderEvaluator(int stages, int micro_batches, const Costs& costs, std::vector<double> memory_limit)
    : p_(stages), m_(micro_batches), limit_(std::move(memory_limit)), comm_(costs.comm) {
  for (int s = 0; s < p_; ++s) {
    f_.push_back(costs.f(s));
    b_.push_back(costs.b(s));
    w_.push_back(costs.w(s));
  }
  const std::size_t n = static_cast<std::size_t>(p_) * m_;
  end_f_.resize(n);
  end_b_.resize(n);
  pos_.resize(p_);
  clock_.resize(p_);
  first_.resize(p_);
  mem_.resize(p_);
}

OrderScore OrderEvaluator::operator()(const Order& order) {
  ++evaluations_;
  const double unknown = -1;
  std::fill(end_f_.begin(), end_f_.end(), unknown);
  std::fill(end_b_.begin(), end_b_.end(), unknown);
  std::fill(pos_.begin(), pos_.end(), 0);
  std::fill(clock_.begin(), clock_.end(), 0.0);
  std::fill(first_.begin(), first_.end(), std::numeric_limits<double>::infinity());
  std::fill(mem_.begin(), mem_.end(), 0);
  OrderScore score;
  bool progress = true;
  while (progress) {
    progress = false;
    for (int s = 0; s < p_; ++s) {
      const auto& list = order[s];
      while (pos_[s] < list.size()) {
        const Action& a = list[pos_[s]];
        const std::size_t k = static_cast<std::size_t>(s) * m_ + a.micro;
        double ready = clock_[s], dur = 0;
        if (a.kind == ActionKind::forward) {
          if (s > 0) {
            const double e = end_f_[k - m_];
            if (e < 0) break;
            ready = std::max(ready, e + comm_);
          }
          if (++mem_[s] > limit_[s] + 1e-9) return score;  // infeasible
          dur = f_[s];
        } else if (a.kind == ActionKind::backward_input || a.kind == ActionKind::backward_full) {
          if (end_f_[k] < 0) return score;  // B before its own F: not a valid order
          if (s < p_ - 1) {
            const double e = end_b_[k + m_];
            if (e < 0) break;
            ready = std::max(ready, e + comm_);
          }
          dur = a.kind == ActionKind::backward_full ? b_[s] + w_[s] : b_[s];
        } else {
          if (end_b_[k] < 0) return score;  // W before its B
          dur = w_[s];
        }
        first_[s] = std::min(first_[s], ready);
        clock_[s] = ready + dur;
        if (a.kind == ActionKind::forward)
          end_f_[k] = clock_[s];
        else if (a.kind != ActionKind::backward_weight)
          end_b_[k] = clock_[s];
        if (a.kind == ActionKind::backward_weight || a.kind == ActionKind::backward_full) --mem_[s];
        ++pos_[s];
        progress = true;
      }
    }
  }
  for (int s = 0; s < p_; ++s) {
    if (pos_[s] != order[s].size()) return score;  // deadlock
    const double span = order[s].empty() ? 0 : clock_[s] - first_[s];
    score.makespan = std::max(score.makespan, span);
    score.spans += span;
  }
  score.feasible = true;
  return score;
}

}  // namespace strata::pipeline::detail
