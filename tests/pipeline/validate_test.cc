// The validator: every generated schedule passes; each kind of broken schedule is caught
// with a message naming the stage and the action, deadlocks included.
#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>

#include "pipeline/generators.h"
#include "pipeline/simulate.h"
#include "runtime/core/error.h"

using namespace strata;
using namespace strata::pipeline;

namespace {

Schedule load(const char* text) { return parse_schedule(text); }

std::string errors_of(const Schedule& s) {
  const auto r = validate(s);
  return r.summary();
}

}  // namespace

TEST_CASE("every generator's schedule is valid over a sweep of p and m", "[pipeline]") {
  const int p = GENERATE(1, 2, 3, 4, 5, 8);
  const int m = GENERATE(1, 2, 3, 4, 7, 8, 16);
  INFO("p=" << p << " m=" << m);
  std::vector<Schedule> all = {gpipe(p, m), one_f_one_b(p, m)};
  if (m >= p) {
    all.push_back(zb_h1(p, m));
    all.push_back(zb_h2(p, m));
  }
  if (m % p == 0) {
    for (int v : {1, 2, 3}) all.push_back(interleaved_1f1b(p, m, v));
  }
  AutoOptions a;
  a.stages = p;
  a.micro_batches = m;
  a.search_evaluations = 300;
  all.push_back(zb_auto(a));
  for (const auto& s : all) {
    INFO(s.kind << " v=" << s.chunks);
    const auto r = validate(s);
    CHECK(r.summary() == "");
    // Counts: one F per micro-batch and chunk on every stage, one OPT per stage.
    for (const auto& list : s.actions) {
      const auto fwd =
          std::count_if(list.begin(), list.end(), [](const Action& x) { return x.kind == ActionKind::forward; });
      CHECK(fwd == m * s.chunks);
      CHECK(list.back().kind == ActionKind::optimizer_step);
    }
  }
}

TEST_CASE("a missing receive, a wrong peer and a stray send are reported", "[pipeline][negative]") {
  CHECK_THAT(errors_of(load("strata-schedule v1 stages=2 micro=1\n"
                            "stage 0: F0 SA0>1 RG0<1 BW0 OPT\n"
                            "stage 1: F0 BW0 SG0>0 OPT\n")),
             Catch::Contains("stage 1: F0 has no RA0<0 before it"));
  CHECK_THAT(errors_of(load("strata-schedule v1 stages=3 micro=1\n"
                            "stage 0: F0 SA0>2 RG0<1 BW0 OPT\n"
                            "stage 1: RA0<0 F0 SA0>2 RG0<2 BW0 SG0>0 OPT\n"
                            "stage 2: RA0<1 F0 BW0 SG0>1 OPT\n")),
             Catch::Contains("SA0>2 should send to stage 1"));
  CHECK_THAT(errors_of(load("strata-schedule v1 stages=1 micro=1\nstage 0: F0 SA0>0 BW0 OPT\n")),
             Catch::Contains("not another stage"));
}

TEST_CASE("order and count errors are reported", "[pipeline][negative]") {
  CHECK_THAT(errors_of(load("strata-schedule v1 stages=1 micro=2\nstage 0: F0 W0 B0 F1 BW1 OPT\n")),
             Catch::Contains("W0 comes before B0"));
  CHECK_THAT(errors_of(load("strata-schedule v1 stages=1 micro=2\nstage 0: F0 BW0 F0 BW1 OPT\n")),
             Catch::Contains("F0 appears twice (actions 0 and 2)"));
  CHECK_THAT(errors_of(load("strata-schedule v1 stages=1 micro=1\nstage 0: F0 B0 BW0 W0 OPT\n")),
             Catch::Contains("both BW and B/W"));
  CHECK_THAT(errors_of(load("strata-schedule v1 stages=1 micro=1\nstage 0: F0 B0 OPT\n")),
             Catch::Contains("B without W"));
  CHECK_THAT(errors_of(load("strata-schedule v1 stages=1 micro=1\nstage 0: BW0 F0 OPT\n")),
             Catch::Contains("before its F"));
  CHECK_THAT(errors_of(load("strata-schedule v1 stages=1 micro=1\nstage 0: F0 OPT BW0\n")),
             Catch::Contains("OPT (action 1) comes before"));
  CHECK_THAT(errors_of(load("strata-schedule v1 stages=1 micro=1\nstage 0: F0 BW0\n")),
             Catch::Contains("0 optimizer steps"));
  CHECK_THAT(errors_of(load("strata-schedule v1 stages=1 micro=2\nstage 0: F0 F5 BW0 OPT\n")),
             Catch::Contains("outside micro-batches"));
  CHECK_THAT(errors_of(load("strata-schedule v1 stages=1 micro=1 chunks=2\nstage 0: F0:1 F0 BW0 BW0:1 OPT\n")),
             Catch::Contains("uses chunk 0's result before it is made"));
}

TEST_CASE("a schedule whose receives wait on each other is a deadlock", "[pipeline][negative]") {
  // Stage 0 waits for a gradient before sending the activation stage 1 needs first.
  const Schedule s = load(
      "strata-schedule v1 stages=2 micro=1\n"
      "stage 0: F0 RG0<1 SA0>1 BW0 OPT\n"
      "stage 1: RA0<0 F0 BW0 SG0>0 OPT\n");
  const auto r = validate(s);
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.summary(), Catch::Contains("deadlock") && Catch::Contains("stage 0 waits at RG0<1") &&
                              Catch::Contains("stage 1 waits at RA0<0"));
  CHECK_THROWS_WITH(check_valid(s), Catch::Contains("deadlock"));
  CHECK_THROWS_AS(simulate(s, Costs{}), Error);
}

TEST_CASE("swapping two micro-batches' receives on one stage deadlocks a 1F1B schedule", "[pipeline][negative]") {
  Schedule s = one_f_one_b(3, 3);
  auto& list = s.actions[2];
  const auto ra0 = std::find(list.begin(), list.end(), Action{ActionKind::recv_activation, 0, 0, 1});
  const auto ra1 = std::find(list.begin(), list.end(), Action{ActionKind::recv_activation, 1, 0, 1});
  REQUIRE(ra0 != list.end());
  REQUIRE(ra1 != list.end());
  std::iter_swap(ra0, ra1);  // RA1 now comes before F0, which needs RA0 (still before F1)
  const auto r = validate(s);
  // Not a deadlock (sends never block), but F0 now runs before its receive.
  CHECK_THAT(r.summary(), Catch::Contains("RA0<1 comes after the action that needs it"));
}

// Found by fuzz/schedule_fuzz.cc: a header promising the most micro-batches, chunks and
// stages over empty lists made the validator index 2^26 slots per stage (gigabytes).
TEST_CASE("a schedule with fewer compute actions than its shape needs is refused before indexing",
          "[pipeline][negative]") {
  const auto start = std::chrono::steady_clock::now();
  CHECK_THAT(errors_of(load("strata-schedule v1 stages=4096 micro=1048576 chunks=64\n")),
             Catch::Contains("stage 0: 0 compute actions for 1048576 micro-batches x 64 chunks"));
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < 1.0);
  CHECK_THAT(errors_of(load("strata-schedule v1 stages=1 micro=3\nstage 0: F0 BW0 OPT\n")),
             Catch::Contains("stage 0: 2 compute actions for 3 micro-batches x 1 chunks"));
}
