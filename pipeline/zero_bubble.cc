// The Zero Bubble paper's handcrafted schedules (Qi et al., 2024). Both keep 1F1B's
// alternation of forwards and input-gradient passes (B) and defer weight-gradient passes
// (W): stage r runs its warm-up forwards, then F, B and -- once r (ZB-H1) or 2r (ZB-H2) B's
// are ahead of it -- the oldest pending W; leftover W's close the step. The deferred W's
// are what fill the cool-down bubbles of 1F1B.
#include <algorithm>

#include "pipeline/detail/checks.h"
#include "pipeline/generators.h"

namespace strata::pipeline {
namespace {

std::vector<std::vector<Action>> split_backward_order(int p, int m, int (*warmup_of)(int, int),
                                                      int (*delay_of)(int, int)) {
  std::vector<std::vector<Action>> order(p);
  for (int s = 0; s < p; ++s) {
    auto& list = order[s];
    const int warmup = std::min(warmup_of(p, s), m);
    const int delay = delay_of(p, s);
    int next_f = 0, next_w = 0;
    for (; next_f < warmup; ++next_f) list.push_back({ActionKind::forward, next_f, 0, -1});
    for (int k = 0; k < m; ++k) {
      if (k > 0 && next_f < m) list.push_back({ActionKind::forward, next_f++, 0, -1});
      list.push_back({ActionKind::backward_input, k, 0, -1});
      if (k >= delay) list.push_back({ActionKind::backward_weight, next_w++, 0, -1});
    }
    while (next_f < m) list.push_back({ActionKind::forward, next_f++, 0, -1});  // (warm-up < m never leaves any)
    while (next_w < m) list.push_back({ActionKind::backward_weight, next_w++, 0, -1});
  }
  return order;
}

}  // namespace

Schedule zb_h1(int p, int m) {
  detail::check_shape("zb-h1", p, m, 1, true);
  auto order = split_backward_order(
      p, m, [](int pp, int s) { return pp - s; }, [](int, int s) { return s; });
  return add_communication("zb-h1", p, m, 1, order);
}

Schedule zb_h2(int p, int m) {
  detail::check_shape("zb-h2", p, m, 1, true);
  auto order = split_backward_order(
      p, m, [](int pp, int s) { return 2 * (pp - 1 - s) + 1; }, [](int, int s) { return 2 * s; });
  return add_communication("zb-h2", p, m, 1, order);
}

}  // namespace strata::pipeline
