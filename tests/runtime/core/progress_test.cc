// Progress (runtime/core/progress.h): silent for a phase that ends within two seconds; past
// them, a line with the bytes done, the share and the rate, and a last line at the end;
// nothing on a quiet rank.
#include "runtime/core/progress.h"

#include <catch2/catch.hpp>
#include <thread>

#include "runtime/core/log.h"
#include "tests/support/stderr_capture.h"

using namespace strata;

TEST_CASE("a short phase prints nothing, a long one its progress and its end", "[core][progress]") {
  const auto old_level = log_level();
  set_log_level(LogLevel::info);
  std::string quick, slow, quiet;
  {
    test::StderrCapture capture;
    {
      Progress p("quick phase", 1 << 20);
      p.advance(1 << 20);
    }
    quick = capture.text();
  }
  {
    test::StderrCapture capture;
    {
      Progress p("slow phase", 4 << 20);
      p.advance(1 << 20);
      std::this_thread::sleep_for(std::chrono::milliseconds(2100));
      p.advance(1 << 20);  // two seconds in: a line
      p.advance(2 << 20);
    }
    slow = capture.text();
  }
  {
    test::StderrCapture capture;
    {
      Progress p("quiet phase", 2 << 20, true);
      std::this_thread::sleep_for(std::chrono::milliseconds(2100));
      p.advance(2 << 20);
    }
    quiet = capture.text();
  }
  set_log_level(old_level);
  CHECK(quick.empty());
  CHECK_THAT(slow, Catch::Contains("slow phase: 2.00 MiB of 4.00 MiB (50%)"));
  CHECK_THAT(slow, Catch::Contains("slow phase: 4.00 MiB in "));
  CHECK(quiet.empty());
}
