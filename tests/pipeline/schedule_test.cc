// The schedule IR: action tokens, text and CSV forms round-trip, and parse errors that
// name the line and the token.
#include <catch2/catch.hpp>

#include "pipeline/generators.h"
#include "pipeline/schedule.h"
#include "runtime/core/error.h"

using namespace strata;
using namespace strata::pipeline;

TEST_CASE("every action kind prints as a token and parses back", "[pipeline]") {
  const Action actions[] = {
      {ActionKind::forward, 3, 0, -1},        {ActionKind::forward, 12, 2, -1},
      {ActionKind::backward_input, 0, 1, -1}, {ActionKind::backward_weight, 7, 0, -1},
      {ActionKind::backward_full, 5, 3, -1},  {ActionKind::send_activation, 4, 0, 2},
      {ActionKind::recv_activation, 4, 1, 0}, {ActionKind::send_gradient, 9, 0, 0},
      {ActionKind::recv_gradient, 1, 2, 3},   {ActionKind::optimizer_step, 0, 0, -1},
  };
  for (const Action& a : actions) {
    const std::string tok = format_action(a);
    INFO(tok);
    CHECK(parse_action(tok) == a);
  }
  CHECK(format_action({ActionKind::forward, 3, 1, -1}) == "F3:1");
  CHECK(format_action({ActionKind::send_activation, 3, 0, 2}) == "SA3>2");
  CHECK(format_action({ActionKind::recv_gradient, 3, 0, 2}) == "RG3<2");
}

TEST_CASE("malformed action tokens are rejected with the token named", "[pipeline][negative]") {
  for (const char* bad : {"X3", "F", "F-1", "F3:", "SA3", "SA3<1", "RA3>1", "F3x", "OPT1", "BW", ""}) {
    INFO(bad);
    CHECK_THROWS_AS(parse_action(bad), Error);
  }
  CHECK_THROWS_WITH(parse_action("Q7"), Catch::Contains("'Q7'"));
}

TEST_CASE("schedules round-trip through text and CSV", "[pipeline]") {
  const Schedule s =
      GENERATE(gpipe(3, 4), one_f_one_b(4, 6), interleaved_1f1b(2, 4, 3), zb_h1(3, 5), zb_h2(4, 8), one_f_one_b(1, 3));
  INFO(s.kind);
  const std::string text = to_text(s);
  const Schedule t = parse_schedule(text);
  CHECK(t.kind == s.kind);
  CHECK(t.stages == s.stages);
  CHECK(t.micro_batches == s.micro_batches);
  CHECK(t.chunks == s.chunks);
  CHECK(t.actions == s.actions);
  CHECK(to_text(t) == text);
  const Schedule c = parse_schedule(to_csv(s));
  CHECK(c.actions == s.actions);
  CHECK(c.chunks == s.chunks);
  CHECK(to_csv(c) == to_csv(s));
}

TEST_CASE("the text form is one line per stage under a header", "[pipeline]") {
  const std::string text = to_text(one_f_one_b(2, 2));
  CHECK(text ==
        "strata-schedule v1 kind=1f1b stages=2 micro=2 chunks=1\n"
        "stage 0: F0 SA0>1 F1 SA1>1 RG0<1 BW0 RG1<1 BW1 OPT\n"
        "stage 1: RA0<0 F0 BW0 SG0>0 RA1<0 F1 BW1 SG1>0 OPT\n");
}

TEST_CASE("schedule text errors name the line", "[pipeline][negative]") {
  CHECK_THROWS_WITH(parse_schedule(""), Catch::Contains("empty"));
  CHECK_THROWS_WITH(parse_schedule("hello\n"), Catch::Contains("header"));
  CHECK_THROWS_WITH(parse_schedule("strata-schedule v1 stages=2\n"), Catch::Contains("micro="));
  CHECK_THROWS_WITH(parse_schedule("strata-schedule v1 stages=0 micro=2\n"), Catch::Contains("at least 1"));
  CHECK_THROWS_WITH(parse_schedule("strata-schedule v1 stages=2 micro=2 color=red\n"), Catch::Contains("'color'"));
  CHECK_THROWS_WITH(parse_schedule("strata-schedule v1 stages=2 micro=2\nstage 0: F0 Z1\n"),
                    Catch::Contains("line 2") && Catch::Contains("'Z1'"));
  CHECK_THROWS_WITH(parse_schedule("strata-schedule v1 stages=2 micro=2\nstage 5: F0\n"), Catch::Contains("stage 5"));
  CHECK_THROWS_WITH(parse_schedule("strata-schedule v1 stages=2 micro=2\nstage 0: F0\nstage 0: F1\n"),
                    Catch::Contains("twice"));
  CHECK_THROWS_WITH(parse_schedule("# strata-schedule v1 stages=1 micro=1\nstage,index,action,kind,micro,chunk,peer\n"
                                   "0,1,F0,forward,0,0,-1\n"),
                    Catch::Contains("out of order"));
}
