// Order search: the local search behind zb-auto and the exhaustive search for tiny cases
// (zb_exact), which the tests use to measure how far the heuristic is from an optimum.
#include <algorithm>

#include "pipeline/detail/checks.h"
#include "pipeline/detail/search.h"
#include "pipeline/generators.h"
#include "runtime/core/error.h"

namespace strata::pipeline {
namespace detail {

void local_search(Candidate& c, OrderEvaluator& eval, int max_evaluations) {
  constexpr int kWindow = 6;
  bool improved = true;
  while (improved && eval.evaluations() < max_evaluations) {
    improved = false;
    for (std::size_t s = 0; s < c.order.size(); ++s) {
      auto& list = c.order[s];
      const int n = static_cast<int>(list.size());
      for (int i = 0; i < n && eval.evaluations() < max_evaluations; ++i) {
        for (int d = -kWindow; d <= kWindow && eval.evaluations() < max_evaluations; ++d) {
          const int j = i + d;
          if (d == 0 || j < 0 || j >= n) continue;
          // Never past an action of the same kind.
          bool crosses = false;
          for (int k = std::min(i, j); k <= std::max(i, j) && !crosses; ++k)
            crosses = k != i && list[k].kind == list[i].kind;
          if (crosses) continue;
          auto move = [&](int from, int to) {
            if (from < to)
              std::rotate(list.begin() + from, list.begin() + from + 1, list.begin() + to + 1);
            else
              std::rotate(list.begin() + to, list.begin() + from, list.begin() + from + 1);
          };
          move(i, j);
          const OrderScore score = eval(c.order);
          if (score.better_than(c.score)) {
            c.score = score;
            improved = true;
          } else {
            move(j, i);
          }
        }
      }
    }
  }
  if (c.name.find("+search") == std::string::npos) c.name += "+search";
}

Order split_full_backward(const Order& order) {
  Order out(order.size());
  for (std::size_t s = 0; s < order.size(); ++s) {
    for (const Action& a : order[s]) {
      if (a.kind == ActionKind::backward_full) {
        out[s].push_back({ActionKind::backward_input, a.micro, a.chunk, -1});
        out[s].push_back({ActionKind::backward_weight, a.micro, a.chunk, -1});
      } else {
        out[s].push_back(a);
      }
    }
  }
  return out;
}

namespace {

// Every sequence of m F's, m B's and m W's (each kind in micro-batch order) in which no
// B runs before its F nor W before its B, with at most `limit` micro-batches live.
void enumerate_stage(int m, double limit, std::vector<Action>& cur, int nf, int nb, int nw,
                     std::vector<std::vector<Action>>& out, std::size_t cap) {
  if (out.size() > cap) return;
  if (nw == m) {
    out.push_back(cur);
    return;
  }
  if (nf < m && nf - nw + 1 <= limit + 1e-9) {
    cur.push_back({ActionKind::forward, nf, 0, -1});
    enumerate_stage(m, limit, cur, nf + 1, nb, nw, out, cap);
    cur.pop_back();
  }
  if (nb < nf) {
    cur.push_back({ActionKind::backward_input, nb, 0, -1});
    enumerate_stage(m, limit, cur, nf, nb + 1, nw, out, cap);
    cur.pop_back();
  }
  if (nw < nb) {
    cur.push_back({ActionKind::backward_weight, nw, 0, -1});
    enumerate_stage(m, limit, cur, nf, nb, nw + 1, out, cap);
    cur.pop_back();
  }
}

}  // namespace
}  // namespace detail

Schedule zb_exact(const AutoOptions& o, double* makespan) {
  detail::check_shape("zb-exact", o.stages, o.micro_batches, 1, false);
  o.costs.check(o.stages);
  const int p = o.stages, m = o.micro_batches;
  const auto limit = detail::expand_memory_limit(o.memory_limit, p);
  constexpr double kMaxCombinations = 3e6;
  std::vector<std::vector<std::vector<Action>>> options(p);
  double combos = 1;
  for (int s = 0; s < p; ++s) {
    std::vector<Action> cur;
    detail::enumerate_stage(m, limit[s], cur, 0, 0, 0, options[s], static_cast<std::size_t>(kMaxCombinations));
    combos *= static_cast<double>(options[s].size());
    STRATA_CHECK(combos <= kMaxCombinations, Errc::invalid_argument, "zb-exact: p=", p, " m=", m, " has more than ",
                 kMaxCombinations, " orders to try; the exhaustive search is for tiny cases");
  }
  detail::OrderEvaluator eval(p, m, o.costs, limit);
  std::vector<std::size_t> pick(p, 0);
  detail::Order order(p), best;
  detail::OrderScore best_score;
  for (;;) {
    for (int s = 0; s < p; ++s) order[s] = options[s][pick[s]];
    const auto score = eval(order);
    if (score.feasible && (best.empty() || score.better_than(best_score))) {
      best = order;
      best_score = score;
    }
    int s = 0;
    while (s < p && ++pick[s] == options[s].size()) pick[s++] = 0;
    if (s == p) break;
  }
  STRATA_CHECK(!best.empty(), Errc::internal, "zb-exact: no feasible order");
  if (makespan != nullptr) *makespan = best_score.makespan;
  return add_communication("zb-exact", p, m, 1, best);
}

}  // namespace strata::pipeline
