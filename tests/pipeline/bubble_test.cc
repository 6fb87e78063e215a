// Measured against simulated bubbles: layers that take fixed times (they sleep, so four
// stage threads do not compete for the two cores), few and long actions, and the executor's
// own timings summarized exactly as the simulator's. The margin is stated here and in
// docs/pipeline.md: the measured bubble rate is within 0.03 (absolute) of the simulated.
#include <catch2/catch.hpp>
#include <cmath>

#include "pipeline/generators.h"
#include "pipeline/runner.h"
#include "pipeline/simulate.h"
#include "tests/pipeline/common.h"

using namespace strata;
using namespace strata::pipeline;

namespace {

constexpr double kMargin = 0.03;
constexpr double kUnitS = 0.012;  // F = B = W = 12 ms per stage

struct Measured {
  TimelineStats sim, got;
};

Measured measure(const Schedule& s) {
  SyntheticModelSpec spec;
  spec.layers = s.virtual_stages();
  spec.width = 8;
  spec.rows = 2;
  spec.micro_batches = s.micro_batches;
  // One layer per virtual stage: a chunk's F takes F/v, as the simulator assumes.
  spec.layer_time_s = kUnitS / s.chunks;
  const PipelineModel model = synthetic_model(spec);
  auto stores = test::stage_stores(s, model, 1);
  // The second step is measured: the first pays for first-touch memory and thread start-up.
  const auto reports = run_stages_as_threads(s, model, test::pointers(stores), {}, 2);
  Measured out;
  out.got = summarize(measured_timeline(s, reports));
  out.sim = simulate(s, Costs::uniform(kUnitS, kUnitS, kUnitS)).stats;
  return out;
}

}  // namespace

TEST_CASE("measured bubbles match the simulated ones for steady layers", "[pipeline][timing]") {
  const Schedule s = GENERATE(gpipe(4, 8), one_f_one_b(4, 8), interleaved_1f1b(4, 8, 2), zb_h1(4, 8), zb_h2(4, 8));
  // Noise on a shared 2-core VM only ever adds time (late wake-ups, a neighbour's burst):
  // the fastest of up to three runs is the schedule's own timing.
  Measured r = measure(s);
  for (int attempt = 1; attempt < 3 && (std::abs(r.got.bubble_rate - r.sim.bubble_rate) > kMargin ||
                                        r.got.makespan > r.sim.makespan * 1.10);
       ++attempt) {
    const Measured again = measure(s);
    if (again.got.makespan < r.got.makespan) r = again;
  }
  INFO(s.kind << ": simulated bubble " << r.sim.bubble_rate << ", measured " << r.got.bubble_rate
              << "; makespan simulated " << r.sim.makespan << " s, measured " << r.got.makespan << " s");
  CHECK(std::abs(r.got.bubble_rate - r.sim.bubble_rate) <= kMargin);
  CHECK(r.got.makespan >= r.sim.makespan * 0.99);
  CHECK(r.got.makespan <= r.sim.makespan * 1.10);
}
