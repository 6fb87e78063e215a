// Stages as processes: the test binary relaunches itself as p ranks through the real
// launcher (as `strata launch` does); each rank runs its stage with Gloo send/recv, then
// checks its own layers' gradients bit for bit against a sequential loop it runs itself.
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include <catch2/catch.hpp>

#include "pipeline/generators.h"
#include "pipeline/runner.h"
#include "pipeline/simulate.h"
#include "runtime/comm/communicator.h"
#include "runtime/core/error.h"
#include "tests/pipeline/common.h"

using namespace strata;
using namespace strata::pipeline;

namespace {

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : fallback;
}

Schedule make_schedule(const std::string& kind, int p, int m, int v) {
  GenerateOptions g;
  g.kind = parse_schedule_kind(kind);
  g.stages = p;
  g.micro_batches = m;
  g.chunks = v;
  g.costs = Costs::uniform(1, 1.25, 0.75, 0.1);
  return generate(g);
}

}  // namespace

// Runs only when launched by run_pipeline_ranks (hidden tag).
TEST_CASE("pipeline worker process", "[.pipeline-worker]") {
  if (std::getenv("STRATA_TEST_KIND") == nullptr) return;  // selected by a broad filter, not launched
  comm::CommOptions co;
  co.rendezvous = comm::rendezvous_from_env();
  auto c = comm::Communicator::create(co);
  const std::string kind = env_or("STRATA_TEST_KIND", "1f1b");
  const int m = std::atoi(env_or("STRATA_TEST_MICRO", "8").c_str());
  const int v = std::atoi(env_or("STRATA_TEST_CHUNKS", "1").c_str());
  const double unit_s = std::atof(env_or("STRATA_TEST_UNIT_MS", "0").c_str()) / 1e3;
  const Schedule s = make_schedule(kind, c->world_size(), m, v);
  SyntheticModelSpec spec;
  spec.layers = unit_s > 0 ? s.virtual_stages() : 2 * s.virtual_stages();
  spec.width = 10;
  spec.rows = 3;
  spec.micro_batches = m;
  spec.unsplittable_every = 3;
  spec.layer_time_s = unit_s / s.chunks;
  const PipelineModel model = synthetic_model(spec);
  ExecutorOptions o;
  o.remat = parse_remat(env_or("STRATA_TEST_REMAT", "never"));
  LocalParameterStore mine(model, stage_layers(s, model, c->rank()), 5);
  // Timed runs report their second step: the first warms up connections and memory.
  const StageReport report = run_stage_as_rank(s, model, mine, *c, o, unit_s > 0 ? 2 : 1);
  std::vector<int> all(model.layers.size());
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
  LocalParameterStore reference(model, all, 5);
  run_sequential(model, m, reference);
  const std::string diff = test::compare_grads(mine, reference);
  const auto reports = gather_reports(*c, report);
  if (c->rank() == 0) {
    std::size_t actions = 0;
    for (const auto& r : reports) actions += r.timings.size();
    std::size_t want = 0;
    for (const auto& list : s.actions) want += list.size();
    std::printf("GATHERED %zu of %zu\n", actions, want);
    if (unit_s > 0) {
      const auto got = summarize(measured_timeline(s, reports));
      const auto sim = simulate(s, Costs::uniform(unit_s, unit_s, unit_s)).stats;
      std::printf("BUBBLE measured %.6f simulated %.6f\n", got.bubble_rate, sim.bubble_rate);
    }
  }
  std::printf(diff.empty() ? "PIPELINE WORKER OK rank %d\n" : "PIPELINE WORKER MISMATCH rank %d: %s\n", c->rank(),
              diff.c_str());
  std::fflush(stdout);
}

TEST_CASE("pipelined gradients equal a sequential loop bit for bit, stages as processes", "[pipeline][process]") {
  struct Run {
    const char* kind;
    int p, m, v;
    const char* remat;
  };
  const Run r = GENERATE(values<Run>({{"1f1b", 4, 8, 1, "never"},
                                      {"zb-h1", 3, 6, 1, "except_last"},
                                      {"interleaved", 2, 4, 2, "always"},
                                      {"zb-h2", 3, 6, 1, "never"},
                                      {"zb-auto", 3, 5, 1, "never"},
                                      {"gpipe", 2, 3, 1, "always"}}));
  INFO(r.kind << " p=" << r.p << " m=" << r.m << " v=" << r.v << " remat=" << r.remat);
  const auto res = test::run_pipeline_ranks(r.p, {{"STRATA_TEST_KIND", r.kind},
                                                  {"STRATA_TEST_MICRO", std::to_string(r.m)},
                                                  {"STRATA_TEST_CHUNKS", std::to_string(r.v)},
                                                  {"STRATA_TEST_REMAT", r.remat}});
  for (const auto& rank : res.ranks) {
    INFO("rank " << rank.rank << " output:\n" << rank.output);
    CHECK_THAT(rank.output, Catch::Contains("PIPELINE WORKER OK"));
  }
  REQUIRE(res.exit_code == 0);
  CHECK_THAT(res.ranks[0].output, Catch::Contains("GATHERED"));
  const auto& out = res.ranks[0].output;
  const auto pos = out.find("GATHERED ");
  if (pos != std::string::npos) {
    std::size_t got = 0, want = 0;
    std::sscanf(out.c_str() + pos, "GATHERED %zu of %zu", &got, &want);
    CHECK(got == want);
  }
}

TEST_CASE("measured bubbles match the simulated ones with stages as processes", "[pipeline][process][timing]") {
  // Same margin as with threads (bubble_test.cc): 0.03 absolute.
  const char* kind = GENERATE("1f1b", "zb-h1");
  const auto res = test::run_pipeline_ranks(
      4, {{"STRATA_TEST_KIND", kind}, {"STRATA_TEST_MICRO", "8"}, {"STRATA_TEST_UNIT_MS", "24"}});
  REQUIRE(res.exit_code == 0);
  const auto& out = res.ranks[0].output;
  const auto pos = out.find("BUBBLE ");
  REQUIRE(pos != std::string::npos);
  double got = -1, sim = -1;
  std::sscanf(out.c_str() + pos, "BUBBLE measured %lf simulated %lf", &got, &sim);
  INFO(kind << ": measured " << got << ", simulated " << sim);
  CHECK(std::abs(got - sim) <= 0.03);
}
