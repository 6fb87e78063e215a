// The automatic zero-bubble scheduler (see generators.h): the paper's greedy heuristic run
// over a grid of its binary choices, seeded search with the handcrafted schedules, and a
// local search that refines the best order.
//
// The greedy list scheduler advances the stage that is free earliest. Before a stage's
// first B it runs forwards while memory (and the warm-up cap) allows and no B is about to
// arrive; afterwards it alternates F and B (1F1B); when the one it wants is not ready it
// runs the other if that is ready and the wanted one's producer is not even placed yet, a
// pending W if memory is full, or a pending W if the gap is at least a W long (or always,
// with fill_small). Ready times of passes not yet placed on a neighbouring stage are
// estimated from that stage's clock (a lower bound).
#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>

#include "pipeline/detail/checks.h"
#include "pipeline/detail/order_eval.h"
#include "pipeline/detail/search.h"
#include "pipeline/generators.h"
#include "runtime/core/error.h"

namespace strata::pipeline {
namespace {

using detail::Order;
constexpr double kInf = std::numeric_limits<double>::infinity();

enum class WarmupCap { memory, one_f_one_b, zb_h2 };

struct GreedyChoice {
  bool fill_small = false;  // run a W even in a gap shorter than W
  bool no_delay_b = true;   // in warm-up, no F that would make an arriving B wait
  bool flexible = false;    // run the other of F/B when the wanted one is not ready
  WarmupCap cap = WarmupCap::memory;
};

std::string describe(const GreedyChoice& c) {
  const char* cap = c.cap == WarmupCap::memory ? "memory" : c.cap == WarmupCap::one_f_one_b ? "p-r" : "2(p-r)-1";
  return str_cat("heuristic(warmup=", cap, c.fill_small ? ",fill-small" : "", c.no_delay_b ? ",no-delay-b" : "",
                 c.flexible ? ",flexible" : "", ")");
}

class Greedy {
 public:
  Greedy(const AutoOptions& o, const std::vector<double>& limit, GreedyChoice choice)
      : p_(o.stages), m_(o.micro_batches), costs_(o.costs), limit_(limit), c_(choice) {}

  Order run() {
    t_.assign(p_, 0.0);
    nf_.assign(p_, 0);
    nb_.assign(p_, 0);
    nw_.assign(p_, 0);
    mem_.assign(p_, 0);
    last_main_.assign(p_, ActionKind::optimizer_step);  // none yet
    wq_.assign(p_, {});
    end_f_.assign(static_cast<std::size_t>(p_) * m_, kInf);
    end_b_.assign(static_cast<std::size_t>(p_) * m_, kInf);
    order_.assign(p_, {});
    const long limit_steps = 64L * p_ * m_ + 1000;
    for (long step = 0; !all_done(); ++step) {
      STRATA_CHECK(step < limit_steps, Errc::internal, "zb-auto: the greedy scheduler made no progress (p=", p_,
                   " m=", m_, ")");
      decide(earliest_stage());
    }
    return order_;
  }

 private:
  struct Ready {
    double at = kInf;  // when it can start (a lower bound when !known)
    bool known = false;
    bool exists = false;
  };

  bool done(int s) const { return nf_[s] == m_ && nb_[s] == m_ && nw_[s] == m_; }
  bool all_done() const {
    for (int s = 0; s < p_; ++s) {
      if (!done(s)) return false;
    }
    return true;
  }
  int earliest_stage() const {
    int best = -1;
    for (int s = p_ - 1; s >= 0; --s) {  // ties: the later stage, whose B's others wait for
      if (!done(s) && (best < 0 || t_[s] < t_[best])) best = s;
    }
    return best;
  }
  std::size_t at(int s, int mb) const { return static_cast<std::size_t>(s) * m_ + mb; }

  Ready ready_f(int s) const {
    if (nf_[s] >= m_ || mem_[s] + 1 > limit_[s] + 1e-9) return {};
    if (s == 0) return {0.0, true, true};
    const double e = end_f_[at(s - 1, nf_[s])];
    if (e < kInf) return {e + costs_.comm, true, true};
    return {t_[s - 1] + costs_.f(s - 1) + costs_.comm, false, true};
  }
  Ready ready_b(int s) const {
    if (nb_[s] >= m_) return {};
    if (nb_[s] >= nf_[s]) return {kInf, false, true};
    if (s == p_ - 1) return {end_f_[at(s, nb_[s])], true, true};
    const double e = end_b_[at(s + 1, nb_[s])];
    if (e < kInf) return {e + costs_.comm, true, true};
    return {t_[s + 1] + costs_.b(s + 1) + costs_.comm, false, true};
  }
  int warmup_cap(int s) const {
    switch (c_.cap) {
      case WarmupCap::memory:
        return m_;
      case WarmupCap::one_f_one_b:
        return p_ - s;
      case WarmupCap::zb_h2:
        return 2 * (p_ - 1 - s) + 1;
    }
    return m_;
  }

  void run_f(int s, double ready) {
    const int mb = nf_[s]++;
    t_[s] = std::max(t_[s], ready) + costs_.f(s);
    end_f_[at(s, mb)] = t_[s];
    ++mem_[s];
    last_main_[s] = ActionKind::forward;
    order_[s].push_back({ActionKind::forward, mb, 0, -1});
  }
  void run_b(int s, double ready) {
    const int mb = nb_[s]++;
    t_[s] = std::max(t_[s], ready) + costs_.b(s);
    end_b_[at(s, mb)] = t_[s];
    wq_[s].push_back(mb);
    last_main_[s] = ActionKind::backward_input;
    order_[s].push_back({ActionKind::backward_input, mb, 0, -1});
  }
  void run_w(int s) {
    const int mb = wq_[s].front();
    wq_[s].pop_front();
    ++nw_[s];
    t_[s] += costs_.w(s);
    --mem_[s];
    order_[s].push_back({ActionKind::backward_weight, mb, 0, -1});
  }

  void decide(int s) {
    const double now = t_[s];
    const Ready rf = ready_f(s), rb = ready_b(s);
    if (nb_[s] == 0 && nf_[s] < m_) {  // warm-up
      if (rb.known && rb.at <= now) return run_b(s, rb.at);
      if (rf.known && rf.at <= now && nf_[s] < warmup_cap(s)) {
        const bool b_soon = rb.exists && rb.at < now + costs_.f(s) && nf_[s] > nb_[s];
        if (!(c_.no_delay_b && b_soon)) return run_f(s, rf.at);
      }
    }
    if (nf_[s] == m_ && nb_[s] == m_) return run_w(s);
    // Steady phase: alternate F and B; W's fill the gaps.
    bool want_f;
    if (last_main_[s] == ActionKind::backward_input && rf.exists)
      want_f = true;
    else if (rb.exists && rb.at < kInf)
      want_f = false;
    else if (rf.exists)
      want_f = true;
    else {
      if (!wq_[s].empty()) return run_w(s);
      want_f = false;  // memory full and nothing to recycle: wait for the B
    }
    const Ready want = want_f ? rf : rb, other = want_f ? rb : rf;
    if (want.exists && want.known && want.at <= now) return want_f ? run_f(s, want.at) : run_b(s, want.at);
    // The other pass, when it is ready and the wanted one's producer has not even been
    // placed (waiting for it could wait on this very stage), or always when flexible.
    if ((c_.flexible || !want.known) && other.exists && other.known && other.at <= now)
      return want_f ? run_b(s, other.at) : run_f(s, other.at);
    // Memory is full: recycle it with a W rather than wait (the paper's rule).
    if (nf_[s] < m_ && !rf.exists && !wq_[s].empty()) return run_w(s);
    const double wait_until = want.exists ? want.at : kInf;
    if (!wq_[s].empty() && (wait_until - now >= costs_.w(s) || c_.fill_small)) return run_w(s);
    double next = wait_until;
    if (c_.flexible && other.exists) next = std::min(next, other.at);
    if (next > now && next < kInf) {
      t_[s] = next;
      return;
    }
    // Nothing to estimate from: let the other stages move first.
    double others = kInf;
    for (int x = 0; x < p_; ++x) {
      if (x != s && !done(x)) others = std::min(others, t_[x]);
    }
    STRATA_CHECK(others < kInf, Errc::internal, "zb-auto: stage ", s, " waits for a pass no stage will run");
    t_[s] = std::nextafter(std::max(now, others), kInf);
  }

  int p_, m_;
  const Costs& costs_;
  const std::vector<double>& limit_;
  GreedyChoice c_;
  std::vector<double> t_, end_f_, end_b_;
  std::vector<int> nf_, nb_, nw_, mem_;
  std::vector<ActionKind> last_main_;
  std::vector<std::deque<int>> wq_;
  Order order_;
};

}  // namespace

Schedule zb_auto(const AutoOptions& o, AutoReport* report) {
  detail::check_shape("zb-auto", o.stages, o.micro_batches, 1, false);
  o.costs.check(o.stages);
  const std::vector<double> limit = detail::expand_memory_limit(o.memory_limit, o.stages);
  detail::OrderEvaluator eval(o.stages, o.micro_batches, o.costs, limit);

  std::vector<detail::Candidate> seeds;
  detail::Candidate best_heuristic;
  int stuck = 0;
  for (WarmupCap cap : {WarmupCap::memory, WarmupCap::one_f_one_b, WarmupCap::zb_h2}) {
    for (int bits = 0; bits < 8; ++bits) {
      const GreedyChoice choice{(bits & 1) != 0, (bits & 2) != 0, (bits & 4) != 0, cap};
      detail::Candidate c{describe(choice), {}, {}};
      try {
        c.order = Greedy(o, limit, choice).run();
      } catch (const Error& e) {
        // A heuristic variant that gets stuck is a bug, but the other candidates still
        // give a valid schedule: count it (tests require none) and go on.
        if (e.code() != Errc::internal) throw;
        ++stuck;
        continue;
      }
      c.score = eval(c.order);
      STRATA_CHECK(c.score.feasible, Errc::internal, "zb-auto: ", c.name, " produced an order over the memory limit");
      if (best_heuristic.order.empty() || c.score.better_than(best_heuristic.score)) best_heuristic = c;
    }
  }
  if (!best_heuristic.order.empty()) seeds.push_back(best_heuristic);
  if (o.seed_handcrafted || seeds.empty()) {
    const int p = o.stages, m = o.micro_batches;
    if (m >= p) {
      seeds.push_back({"zb-h1", compute_order(zb_h1(p, m)), {}});
      seeds.push_back({"zb-h2", compute_order(zb_h2(p, m)), {}});
    }
    seeds.push_back({"1f1b-split", detail::split_full_backward(compute_order(one_f_one_b(p, m))), {}});
    for (auto& c : seeds) c.score = eval(c.order);
  }
  std::stable_sort(seeds.begin(), seeds.end(),
                   [](const auto& a, const auto& b) { return a.score.better_than(b.score); });
  STRATA_CHECK(seeds.front().score.feasible, Errc::internal, "zb-auto: no feasible seed");
  detail::Candidate best = seeds.front();
  if (o.local_search) {
    // Refine the two best feasible seeds; the budget is shared, and capped so that the
    // search replays at most ~2e8 actions (about a second) however large the schedule.
    const double actions = 3.0 * o.stages * o.micro_batches;
    const int budget = static_cast<int>(std::min<double>(std::max(0, o.search_evaluations), 2e8 / actions));
    for (std::size_t i = 0; i < seeds.size() && i < 2 && seeds[i].score.feasible; ++i) {
      detail::Candidate c = seeds[i];
      detail::local_search(c, eval, eval.evaluations() + budget / 2);
      if (c.score.better_than(best.score)) best = c;
    }
  }
  if (report != nullptr) {
    report->winner = best.name;
    report->heuristic_makespan = best_heuristic.score.makespan;
    report->makespan = best.score.makespan;
    report->evaluations = eval.evaluations();
    report->stuck_variants = stuck;
  }
  return add_communication("zb-auto", o.stages, o.micro_batches, 1, best.order);
}

}  // namespace strata::pipeline
