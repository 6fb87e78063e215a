// io/'s error text and warning sink: the pieces every io failure message is built from.
#include <catch2/catch.hpp>

#include <cerrno>

#include "io/status.h"
#include "io/warn.h"
#include "tests/io/io_test_util.h"

using namespace strata;

TEST_CASE("errno text names the error and describes it, for either sign", "[status]") {
  CHECK(io::errno_text(ENOSPC) == "ENOSPC (No space left on device)");
  CHECK(io::errno_text(-EFBIG) == "EFBIG (File too large)");
  CHECK(io::errno_text(99999) == "errno 99999");
  const std::string m = io::describe_failure("write", "/d/f.swap", 4096, 1048576, -EIO);
  CHECK(m == "write '/d/f.swap' at offset 4096, length 1048576: EIO (Input/output error)");
  CHECK_THAT(io::errno_hint(-ENOSPC), Catch::Contains("free space"));
  CHECK_THAT(io::errno_hint(EMFILE), Catch::Contains("ulimit -n"));
  CHECK(io::errno_hint(EAGAIN).empty());
}

TEST_CASE("results carry either a value or the status saying why not", "[status]") {
  io::Result<int> good(5);
  CHECK(good.ok());
  CHECK(*good == 5);
  io::Result<int> bad(io::Status(-ENOENT, "no file"));
  CHECK_FALSE(bad.ok());
  CHECK(bad.status().err() == -ENOENT);
  CHECK(bad.status().message() == "no file");
  CHECK(io::Status().ok());
}

TEST_CASE("warn_once reports a key once and warnings reach the installed sink", "[status]") {
  test::WarningCatcher catcher;
  CHECK(io::warn_once("status-test-key", "first"));
  CHECK_FALSE(io::warn_once("status-test-key", "second"));
  io::warn("plain");
  CHECK(catcher.messages() == std::vector<std::string>{"first", "plain"});
}
