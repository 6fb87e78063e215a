// The automatic zero-bubble scheduler: within its memory limit, never worse than ZB-H1 at
// the same limit (unequal F/B/W, per-stage times, communication), close to the exhaustive
// optimum on tiny cases, and clear errors for limits below one micro-batch.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>

#include "pipeline/generators.h"
#include "pipeline/simulate.h"
#include "runtime/core/error.h"

using namespace strata;
using namespace strata::pipeline;

namespace {

struct Case {
  const char* name;
  Costs costs;
};

Costs per_stage(std::vector<double> f, std::vector<double> b, std::vector<double> w, double comm) {
  Costs c;
  c.forward = std::move(f);
  c.backward_input = std::move(b);
  c.backward_weight = std::move(w);
  c.comm = comm;
  return c;
}

Costs shaped(int p, double comm) {
  // Stage s: F grows, B shrinks, W alternates; all different.
  std::vector<double> f, b, w;
  for (int s = 0; s < p; ++s) {
    f.push_back(0.8 + 0.15 * s);
    b.push_back(1.6 - 0.1 * s);
    w.push_back(s % 2 ? 0.5 : 1.1);
  }
  return per_stage(f, b, w, comm);
}

double peak(const SimResult& r) {
  return *std::max_element(r.stats.peak_activations.begin(), r.stats.peak_activations.end());
}

}  // namespace

TEST_CASE("zb-auto stays within its memory limit and is never worse than ZB-H1", "[pipeline]") {
  const int p = GENERATE(2, 3, 4, 6);
  const int mult = GENERATE(1, 2, 3);
  const int m = p * mult + (mult == 2 ? 1 : 0);
  const int extra = GENERATE(0, 1, -1);  // limit p, p+1, 2p-1
  const double limit = extra < 0 ? 2 * p - 1 : p + extra;
  const Case c = GENERATE_COPY(values<Case>({
      {"uniform", Costs::uniform(1, 1, 1)},
      {"W short", Costs::uniform(1, 1, 0.4)},
      {"F long", Costs::uniform(2, 1, 1)},
      {"B long, comm", Costs::uniform(1, 1.7, 0.8, 0.3)},
      {"comm heavy", Costs::uniform(1, 1, 1, 1)},
      {"per-stage, comm", shaped(6, 0.2)},
  }));
  Costs costs = c.costs;
  if (costs.forward.size() > 1) {
    costs.forward.resize(p);
    costs.backward_input.resize(p);
    costs.backward_weight.resize(p);
  }
  INFO(c.name << " p=" << p << " m=" << m << " limit=" << limit);
  AutoOptions o;
  o.stages = p;
  o.micro_batches = m;
  o.costs = costs;
  o.memory_limit = {limit};
  o.search_evaluations = 3000;
  AutoReport report;
  const Schedule s = zb_auto(o, &report);
  const auto r = simulate(s, costs);
  INFO("winner " << report.winner);
  CHECK(peak(r) <= limit);
  CHECK(std::abs(r.stats.makespan - report.makespan) <= 1e-9 * r.stats.makespan);
  const auto h1 = simulate(zb_h1(p, m), costs);
  CHECK(r.stats.makespan <= h1.stats.makespan * (1 + 1e-12));
  const auto f1 = simulate(one_f_one_b(p, m), costs);
  CHECK(r.stats.makespan <= f1.stats.makespan * (1 + 1e-12));
  if (limit >= 2 * p - 1) {
    const auto h2 = simulate(zb_h2(p, m), costs);
    CHECK(r.stats.makespan <= h2.stats.makespan * (1 + 1e-12));
  }
}

TEST_CASE("the zb-auto heuristic alone matches ZB-H1 on uniform times and beats it with heavy communication",
          "[pipeline]") {
  for (int p : {2, 4, 8}) {
    const int m = 2 * p;
    AutoOptions o;
    o.stages = p;
    o.micro_batches = m;
    o.seed_handcrafted = false;
    o.local_search = false;
    o.costs = Costs::uniform(1, 1, 1);
    AutoReport rep;
    zb_auto(o, &rep);
    CHECK(rep.heuristic_makespan == simulate(zb_h1(p, m), o.costs).stats.makespan);
    o.costs = Costs::uniform(1, 1, 1, 1);
    zb_auto(o, &rep);
    INFO("p=" << p);
    if (p > 2) CHECK(rep.heuristic_makespan < simulate(zb_h1(p, m), o.costs).stats.makespan);
  }
}

TEST_CASE("zb-auto reaches zero bubble when memory allows 2p-1 micro-batches", "[pipeline]") {
  const int p = GENERATE(2, 3, 4);
  AutoOptions o;
  o.stages = p;
  o.micro_batches = 3 * p;
  o.memory_limit = {2.0 * p - 1};
  o.costs = Costs::uniform(1, 1, 1);
  const auto r = simulate(zb_auto(o), o.costs);
  CHECK(r.stats.bubble_rate == 0);
}

TEST_CASE("zb-auto is within 5% of the exhaustive optimum on tiny cases", "[pipeline]") {
  struct Tiny {
    int p, m;
    double limit;
    Costs costs;
  };
  const Tiny t = GENERATE(values<Tiny>({
      {2, 2, 2, Costs::uniform(1, 1, 1)},
      {2, 3, 2, Costs::uniform(1, 1, 1, 0.5)},
      {2, 4, 2, Costs::uniform(1.5, 1, 0.5)},
      {2, 4, 3, Costs::uniform(1, 2, 1, 0.25)},
      {3, 3, 3, Costs::uniform(1, 1, 1)},
      {3, 3, 2, Costs::uniform(1, 1.5, 0.5, 0.3)},
      {4, 2, 2, Costs::uniform(1, 1, 1, 0.2)},
  }));
  AutoOptions o;
  o.stages = t.p;
  o.micro_batches = t.m;
  o.memory_limit = {t.limit};
  o.costs = t.costs;
  double exact = 0;
  const Schedule best = zb_exact(o, &exact);
  const auto re = simulate(best, o.costs);
  CHECK(std::abs(re.stats.makespan - exact) <= 1e-9 * exact);
  for (double x : re.stats.peak_activations) CHECK(x <= t.limit);
  const auto ra = simulate(zb_auto(o), o.costs);
  INFO("p=" << t.p << " m=" << t.m << " limit=" << t.limit << " exact=" << exact << " auto=" << ra.stats.makespan);
  CHECK(ra.stats.makespan >= exact * (1 - 1e-12));
  CHECK(ra.stats.makespan <= exact * 1.05);
}

TEST_CASE("zb-auto works down to a memory limit of one micro-batch", "[pipeline][boundary]") {
  AutoOptions o;
  o.stages = 3;
  o.micro_batches = 4;
  o.memory_limit = {1};
  const auto r = simulate(zb_auto(o), Costs{});
  for (double x : r.stats.peak_activations) CHECK(x == 1);
  // One micro-batch at a time through the whole pipe: m (p (F+B) + W) at best per stage.
  CHECK(r.stats.makespan >= 4 * 3 * 2);
  o.micro_batches = 1;
  o.stages = 1;
  CHECK(simulate(zb_auto(o), Costs{}).stats.makespan == 3);
}

TEST_CASE("zb-auto rejects memory limits below one micro-batch", "[pipeline][negative]") {
  AutoOptions o;
  o.stages = 4;
  o.micro_batches = 8;
  o.memory_limit = {0.5};
  CHECK_THROWS_WITH(zb_auto(o), Catch::Contains("below one micro-batch") && Catch::Contains("0.5"));
  o.memory_limit = {4, 4, 0, 4};
  CHECK_THROWS_WITH(zb_auto(o), Catch::Contains("stage 2"));
  o.memory_limit = {4, 4};
  CHECK_THROWS_WITH(zb_auto(o), Catch::Contains("2 values for 4 stages"));
  o.memory_limit = {};
  o.costs = Costs::uniform(0, 0, 0);
  CHECK_THROWS_WITH(zb_auto(o), Catch::Contains("F + B + W = 0"));
  AutoOptions big;
  big.stages = 4;
  big.micro_batches = 6;
  CHECK_THROWS_WITH(zb_exact(big), Catch::Contains("tiny cases"));
}

TEST_CASE("zb-auto finishes within its limit for random per-stage times and memory limits", "[pipeline]") {
  std::uint32_t state = 12345;
  auto rnd = [&] {
    state = state * 1664525u + 1013904223u;
    return static_cast<double>(state >> 8) / static_cast<double>(1u << 24);
  };
  int better = 0, cases = 0;
  for (int p : {2, 3, 4, 6}) {
    for (int trial = 0; trial < 8; ++trial) {
      const int m = p * (1 + trial % 3) + trial % 2;
      Costs c;
      c.forward.clear();
      c.backward_input.clear();
      c.backward_weight.clear();
      for (int s = 0; s < p; ++s) {
        c.forward.push_back(0.5 + 1.5 * rnd());
        c.backward_input.push_back(0.5 + 1.5 * rnd());
        c.backward_weight.push_back(0.2 + 1.8 * rnd());
      }
      c.comm = trial % 3 == 0 ? 0 : 0.5 * rnd();
      const double limit = 1 + std::floor(rnd() * (2 * p));
      INFO("p=" << p << " m=" << m << " limit=" << limit << " trial " << trial);
      AutoOptions o;
      o.stages = p;
      o.micro_batches = m;
      o.costs = c;
      o.memory_limit = {limit};
      o.search_evaluations = 1000;
      AutoReport rep;
      const auto r = simulate(zb_auto(o, &rep), c);
      CHECK(rep.stuck_variants == 0);
      CHECK(peak(r) <= limit);
      if (limit >= p) {
        const double h1 = simulate(zb_h1(p, std::max(m, p)), c).stats.makespan;
        if (m >= p) {
          CHECK(r.stats.makespan <= h1 * (1 + 1e-12));
          better += r.stats.makespan < h1 * (1 - 1e-9) ? 1 : 0;
          ++cases;
        }
      }
    }
  }
  // Unequal stages leave room that the handcrafted schedule does not take.
  CHECK(better * 2 >= cases);
}

TEST_CASE("zb-auto's heuristic does not livelock when a full stage waits on its neighbour", "[pipeline][regression]") {
  // Stage 0 (memory full, one W pending) waited for a B from stage 1, which waited for an
  // F from stage 0 instead of running its ready B; both advanced their clocks forever.
  AutoOptions o;
  o.stages = 4;
  o.micro_batches = 12;
  o.memory_limit = {5};
  o.costs.forward = {0.6523895263671875, 1.4479598999023438, 1.4887924194335938, 0.830230712890625};
  o.costs.backward_input = {0.930023193359375, 0.6700592041015625, 1.8025894165039062, 1.00555419921875};
  o.costs.backward_weight = {1.7449798583984375, 1.1678680419921876, 1.9069732666015624, 1.5119049072265625};
  o.costs.comm = 0.209442138671875;
  o.local_search = false;
  o.seed_handcrafted = false;
  AutoReport rep;
  const auto r = simulate(zb_auto(o, &rep), o.costs);
  CHECK(rep.stuck_variants == 0);
  CHECK(peak(r) <= 5);
}
