// GatherTrace (engine/gather_trace.h): the first step records, later steps replay; leaving
// the order is reported once with the layer the trace expected and stops the replay; a step
// with fewer gathers must be recorded again; next_use looks ahead from the cursor only; the
// fingerprint tells orders apart.
#include <catch2/catch.hpp>

#include "engine/gather_trace.h"

using strata::engine::GatherTrace;

namespace {

void run_step(GatherTrace& t, const std::vector<int>& order) {
  t.begin_step();
  for (int l : order) t.observe(l);
}

}  // namespace

TEST_CASE("the first step records and later steps replay it", "[engine][trace]") {
  GatherTrace t;
  run_step(t, {0, 1, 2, 2, 1, 0});
  CHECK_FALSE(t.replaying());
  CHECK(t.needs_record());
  t.adopt();
  CHECK(t.trace() == std::vector<int>{0, 1, 2, 2, 1, 0});

  t.begin_step();
  CHECK(t.replaying());
  CHECK(t.cursor() == 0);
  CHECK_FALSE(t.observe(0).has_value());
  CHECK_FALSE(t.observe(1).has_value());
  CHECK(t.cursor() == 2);
  CHECK(t.next_use(2) == 2);
  CHECK(t.next_use(0) == 5);  // the 0 at position 0 is behind the cursor
  for (int l : {2, 2, 1, 0}) CHECK_FALSE(t.observe(l).has_value());
  CHECK(t.next_use(0) == t.trace().size() + 1);
  CHECK_FALSE(t.needs_record());
}

TEST_CASE("leaving the order is reported once, with what the trace expected", "[engine][trace]") {
  GatherTrace t;
  run_step(t, {0, 1, 2});
  t.adopt();
  t.begin_step();
  CHECK_FALSE(t.observe(0).has_value());
  const auto left = t.observe(2);
  REQUIRE(left.has_value());
  CHECK(*left == 1);
  CHECK_FALSE(t.replaying());
  CHECK_FALSE(t.observe(1).has_value());  // not reported again
  CHECK(t.needs_record());
  const auto before = t.fingerprint();
  t.adopt();
  CHECK(t.trace() == std::vector<int>{0, 2, 1});

  t.begin_step();
  for (int l : {0, 2, 1}) t.observe(l);
  const auto extra = t.observe(3);  // past the end of the trace
  REQUIRE(extra.has_value());
  CHECK(*extra == -1);
  run_step(t, {0, 2, 1});
  CHECK(t.fingerprint() == before);
}

TEST_CASE("a step with fewer gathers than the trace is recorded again", "[engine][trace]") {
  GatherTrace t;
  run_step(t, {0, 1, 2});
  t.adopt();
  run_step(t, {0, 1});
  CHECK(t.replaying());
  CHECK(t.needs_record());
  GatherTrace u;
  run_step(u, {0, 1});
  CHECK(u.fingerprint() == t.fingerprint());
  run_step(u, {1, 0});
  CHECK(u.fingerprint() != t.fingerprint());
}
