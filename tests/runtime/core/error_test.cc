// The error funnel: codes, messages and the system-call wrapper.
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "runtime/core/error.h"

using namespace strata;

TEST_CASE("STRATA_SYS_CHECK names the call, the context and errno", "[error][negative]") {
  try {
    STRATA_SYS_CHECK(::open("/nonexistent/strata/file", O_RDONLY), "opening swap file '/nonexistent/strata/file'");
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::io);
    CHECK(e.sys_errno() == ENOENT);
    CHECK_THAT(e.what(),
               Catch::Contains("/nonexistent/strata/file") && Catch::Contains("ENOENT") && Catch::Contains("open("));
    CHECK_THAT(e.where(), Catch::Contains("error_test.cc:"));
  }
  const int fd = STRATA_SYS_CHECK(::open("/dev/null", O_RDONLY), "open /dev/null");
  CHECK(fd >= 0);
  ::close(fd);
}

TEST_CASE("STRATA_CHECK throws the given code with the message", "[error]") {
  const auto broken = [](int two) { STRATA_CHECK(1 + 1 == two, Errc::internal, "math broke: ", 42); };
  CHECK_NOTHROW(broken(2));
  CHECK_THROWS_MATCHES(broken(3), Error, Catch::Matchers::Predicate<Error>([](const Error& e) {
                         return e.code() == Errc::internal && std::string(e.what()) == "math broke: 42";
                       }));
  CHECK(errno_text(ENOSPC).find("ENOSPC") == 0);
}
