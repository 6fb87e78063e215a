// The schedule replay (see detail/replay.h). Compute actions never wait on anything but
// the stage itself: their remote inputs arrive through the receive placed before them,
// and their local inputs come earlier in the same list (the validator checks both).
#include "pipeline/detail/replay.h"

#include <algorithm>
#include <limits>

#include "runtime/core/error.h"

namespace strata::pipeline::detail {

std::string replay(const Schedule& s, const Costs& costs, Timeline& out) {
  const int p = s.stages, v = s.chunks, vstages = s.virtual_stages();
  const double unknown = -std::numeric_limits<double>::infinity();
  const std::size_t slots = static_cast<std::size_t>(s.micro_batches) * static_cast<std::size_t>(vstages);
  // Send times, indexed by the sender's (micro-batch, virtual stage).
  std::vector<double> act_sent(slots, unknown), grad_sent(slots, unknown);
  auto slot = [&](int micro, int vs) { return static_cast<std::size_t>(micro) * vstages + vs; };
  std::vector<std::size_t> pos(p, 0);
  std::vector<double> clock(p, 0.0);
  out.stages = p;
  out.micro_batches = s.micro_batches;
  out.chunks = v;
  out.kind = s.kind;
  out.actions.clear();
  out.actions.reserve(s.compute_count() * 2 + p);

  bool progress = true;
  while (progress) {
    progress = false;
    for (int st = 0; st < p; ++st) {
      const auto& list = s.actions[st];
      bool waiting = false;
      while (!waiting && pos[st] < list.size()) {
        const Action& a = list[pos[st]];
        const int vs = s.virtual_stage(st, a.chunk);
        const double start = clock[st];
        double end = start;
        switch (a.kind) {
          case ActionKind::recv_activation:
          case ActionKind::recv_gradient: {
            const bool act = a.kind == ActionKind::recv_activation;
            const double sent = act ? act_sent[slot(a.micro, vs - 1)] : grad_sent[slot(a.micro, vs + 1)];
            waiting = sent == unknown;
            end = std::max(start, sent + costs.comm);
            break;
          }
          case ActionKind::send_activation:
            act_sent[slot(a.micro, vs)] = start;
            break;
          case ActionKind::send_gradient:
            grad_sent[slot(a.micro, vs)] = start;
            break;
          case ActionKind::forward:
            end = start + costs.f(st) / v;
            break;
          case ActionKind::backward_input:
            end = start + costs.b(st) / v;
            break;
          case ActionKind::backward_weight:
            end = start + costs.w(st) / v;
            break;
          case ActionKind::backward_full:
            end = start + (costs.b(st) + costs.w(st)) / v;
            break;
          case ActionKind::optimizer_step:
            end = start + costs.optimizer;
            break;
        }
        if (waiting) break;
        out.actions.push_back({st, a, start, end});
        clock[st] = end;
        ++pos[st];
        progress = true;
      }
    }
  }
  std::string stuck;
  for (int st = 0; st < p; ++st) {
    if (pos[st] == s.actions[st].size()) continue;
    if (!stuck.empty()) stuck += ", ";
    stuck += str_cat("stage ", st, " waits at ", format_action(s.actions[st][pos[st]]), " (action ", pos[st], ")");
  }
  return stuck;
}

}  // namespace strata::pipeline::detail
