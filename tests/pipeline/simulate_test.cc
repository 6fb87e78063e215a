// The simulator against the closed forms of the papers (GPipe, Megatron's interleaving, Zero Bubble):
// GPipe and 1F1B bubble (p-1)/(m+p-1); interleaved (p-1)/(v m) of the ideal time; ZB-H1
// bubble (p-1)(F+B-W); ZB-H2 none once m >= 2p-1; 1F1B keeps min(p-r, m) micro-batches
// of activations on stage r and GPipe m.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>

#include "pipeline/generators.h"
#include "pipeline/simulate.h"
#include "runtime/core/error.h"

using namespace strata;
using namespace strata::pipeline;

namespace {

// Times are sums of a few hundred small terms: allow that many ulps of the makespan.
double tol(const Schedule& s, double makespan) {
  return 4.0 * static_cast<double>(s.compute_count()) * std::numeric_limits<double>::epsilon() *
         std::max(1.0, makespan);
}

}  // namespace

TEST_CASE("GPipe and 1F1B bubble rates are (p-1)/(m+p-1) with uniform times", "[pipeline]") {
  const int p = GENERATE(1, 2, 3, 4, 6, 8);
  const int m = GENERATE(1, 2, 3, 5, 8, 13, 24);
  const auto times =
      GENERATE(std::vector<double>{1, 1, 1}, std::vector<double>{1, 2, 0}, std::vector<double>{0.5, 1.25, 0.75});
  const Costs c = Costs::uniform(times[0], times[1], times[2]);
  const double want = static_cast<double>(p - 1) / (m + p - 1);
  for (const Schedule& s : {gpipe(p, m), one_f_one_b(p, m)}) {
    INFO(s.kind << " p=" << p << " m=" << m << " F,B,W=" << times[0] << "," << times[1] << "," << times[2]);
    const auto r = simulate(s, c);
    CHECK(std::abs(r.stats.bubble_rate - want) <= tol(s, 1));
    const double fbw = times[0] + times[1] + times[2];
    CHECK(std::abs(r.stats.makespan - (m + p - 1) * fbw) <= tol(s, r.stats.makespan));
    CHECK(std::abs(r.ideal - m * fbw) <= tol(s, r.ideal));
    for (int st = 0; st < p; ++st) CHECK(std::abs(r.stats.bubble_rate_per_stage[st] - want) <= tol(s, 1));
  }
}

TEST_CASE("1F1B keeps min(p-r, m) micro-batches of activations on stage r and GPipe keeps m", "[pipeline]") {
  const int p = GENERATE(1, 2, 4, 7);
  const int m = GENERATE(1, 3, 4, 9);
  const auto r1 = simulate(one_f_one_b(p, m), Costs{});
  const auto rg = simulate(gpipe(p, m), Costs{});
  for (int st = 0; st < p; ++st) {
    INFO("p=" << p << " m=" << m << " stage " << st);
    CHECK(r1.stats.peak_activations[st] == std::min(p - st, m));
    CHECK(rg.stats.peak_activations[st] == m);
  }
}

TEST_CASE("interleaved 1F1B's bubble is (p-1)/(v m) of the ideal time", "[pipeline]") {
  const int p = GENERATE(2, 3, 4, 8);
  const int v = GENERATE(1, 2, 3, 4);
  const int groups = GENERATE(1, 2, 3);
  const int m = p * groups;
  // Per-chunk times are a whole stage's times / v: choose multiples of v so they stay exact.
  const Costs c = Costs::uniform(1.0 * v, 2.0 * v, 1.0 * v);
  const Schedule s = interleaved_1f1b(p, m, v);
  INFO("p=" << p << " v=" << v << " m=" << m);
  const auto r = simulate(s, c);
  const double ideal = m * 4.0 * v;
  CHECK(r.ideal == ideal);
  CHECK(std::abs((r.stats.makespan - ideal) / ideal - static_cast<double>(p - 1) / (v * m)) <= tol(s, 1));
  // v times the point-to-point traffic of 1F1B.
  std::size_t sends = 0;
  for (const auto& list : s.actions)
    for (const auto& a : list) sends += a.kind == ActionKind::send_activation ? 1 : 0;
  CHECK(sends == static_cast<std::size_t>(m) * (p * v - 1));
}

TEST_CASE("ZB-H1's bubble is (p-1)(F+B-W) per stage, a third of 1F1B's when F=B=W", "[pipeline]") {
  const int p = GENERATE(2, 3, 4, 5, 8);
  const int extra = GENERATE(0, 1, 4, 9);
  const int m = p + extra;
  // W no longer than F or B, as in the paper's setting.
  const auto t = GENERATE(std::vector<double>{1, 1, 1}, std::vector<double>{2, 1, 1}, std::vector<double>{1, 2, 1},
                          std::vector<double>{1, 1, 0.5}, std::vector<double>{1.5, 1.25, 0.75});
  const Costs c = Costs::uniform(t[0], t[1], t[2]);
  INFO("p=" << p << " m=" << m << " F,B,W=" << t[0] << "," << t[1] << "," << t[2]);
  const Schedule s = zb_h1(p, m);
  const auto r = simulate(s, c);
  const double bubble = (p - 1) * (t[0] + t[1] - t[2]);
  CHECK(std::abs(r.stats.makespan - (m * (t[0] + t[1] + t[2]) + bubble)) <= tol(s, r.stats.makespan));
  for (int st = 0; st < p; ++st) CHECK(r.stats.peak_activations[st] == p);  // 1F1B's peak, p, on every stage
  if (t[0] == t[1] && t[1] == t[2]) {
    CHECK(std::abs(r.stats.bubble_rate - static_cast<double>(p - 1) / (3 * m + p - 1)) <= tol(s, 1));
    const auto r1 = simulate(one_f_one_b(p, m), c);
    CHECK(std::abs(3 * (r.stats.makespan - r.ideal) - (r1.stats.makespan - r1.ideal)) <= tol(s, r1.stats.makespan));
  }
}

TEST_CASE("ZB-H2 has no bubble once m >= 2p-1 and keeps 2p-1 micro-batches", "[pipeline]") {
  const int p = GENERATE(1, 2, 3, 4, 6, 8);
  const int m = GENERATE(1, 2, 3, 4, 5, 7, 8, 11, 15, 16, 24);
  if (m < p) return;
  const Costs c = Costs::uniform(1, 1, 1);
  const auto r = simulate(zb_h2(p, m), c);
  INFO("p=" << p << " m=" << m);
  // Below 2p-1 micro-batches the warm-up is cut short: a bubble of 2p-1-m passes.
  CHECK(r.stats.makespan == 3 * m + std::max(0, 2 * p - 1 - m));
  double peak = 0;
  for (double x : r.stats.peak_activations) peak = std::max(peak, x);
  CHECK(peak == std::min(2 * p - 1, m));
}

TEST_CASE("communication time delays every hop of the critical path", "[pipeline]") {
  // 1F1B, F=B=W=1: each of the p-1 forward and p-1 backward hops before stage 0's first
  // backward adds comm, and so does the drain.
  const int p = GENERATE(2, 4);
  const int m = 8;
  const auto r0 = simulate(one_f_one_b(p, m), Costs::uniform(1, 1, 1, 0));
  const auto rc = simulate(one_f_one_b(p, m), Costs::uniform(1, 1, 1, 0.25));
  CHECK(rc.stats.makespan > r0.stats.makespan);
  CHECK(rc.stats.makespan <= r0.stats.makespan + 2 * (p - 1) * 0.25 * m);
  // A receive's wait shows in the timeline.
  bool waited = false;
  for (const auto& ta : rc.timeline.actions) waited |= ta.action.kind == ActionKind::recv_gradient && ta.end > ta.start;
  CHECK(waited);
}

TEST_CASE("generators reject inputs their schedule cannot honour", "[pipeline][negative]") {
  CHECK_THROWS_WITH(zb_h1(4, 3), Catch::Contains("m=3") && Catch::Contains("m >= p"));
  CHECK_THROWS_WITH(zb_h2(4, 2), Catch::Contains("m >= p"));
  CHECK_THROWS_WITH(interleaved_1f1b(4, 2, 2), Catch::Contains("m >= p"));
  CHECK_THROWS_WITH(interleaved_1f1b(4, 6, 2), Catch::Contains("multiple of stages") && Catch::Contains("m=8"));
  CHECK_THROWS_WITH(interleaved_1f1b(4, 8, 0), Catch::Contains("chunks v=0"));
  CHECK_THROWS_WITH(gpipe(0, 4), Catch::Contains("stages p=0"));
  CHECK_THROWS_WITH(one_f_one_b(2, 0), Catch::Contains("m=0"));
  CHECK_THROWS_WITH(parse_schedule_kind("pipedream"), Catch::Contains("zb-auto"));
  GenerateOptions g;
  g.kind = ScheduleKind::zb_h1;
  g.stages = 2;
  g.micro_batches = 4;
  g.chunks = 2;
  CHECK_THROWS_WITH(generate(g), Catch::Contains("only to the interleaved"));
  CHECK_THROWS_WITH(simulate(one_f_one_b(2, 2), Costs::uniform(1, -1, 1)), Catch::Contains(">= 0"));
  Costs bad;
  bad.forward = {1, 2, 3};
  CHECK_THROWS_WITH(simulate(one_f_one_b(2, 2), bad), Catch::Contains("3 values given for 2 stages"));
}

TEST_CASE("a single stage has no bubble and one micro-batch has the longest", "[pipeline][boundary]") {
  CHECK(simulate(one_f_one_b(1, 5), Costs{}).stats.bubble_rate == 0);
  CHECK(simulate(interleaved_1f1b(1, 3, 4), Costs::uniform(4, 4, 4)).stats.bubble_rate == 0);
  const auto r = simulate(gpipe(5, 1), Costs{});
  CHECK(r.stats.bubble_rate == Approx(4.0 / 5.0).epsilon(1e-12));
}
