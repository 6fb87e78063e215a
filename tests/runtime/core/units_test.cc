// Byte and count parsing as users type them in configs and flags.
#include <catch2/catch.hpp>

#include "runtime/core/error.h"
#include "runtime/core/units.h"

using namespace strata;

TEST_CASE("byte sizes parse with binary and decimal units", "[units]") {
  CHECK(parse_bytes("4096") == 4096);
  CHECK(parse_bytes("1MiB") == 1048576);
  CHECK(parse_bytes("8GiB") == 8ull << 30);
  CHECK(parse_bytes("8 GiB") == 8ull << 30);
  CHECK(parse_bytes("1.5GiB") == 3ull << 29);
  CHECK(parse_bytes("512MB") == 512000000);
  CHECK(parse_bytes("1e9") == 1000000000);
  CHECK(parse_bytes("2TiB") == 2ull << 40);
  CHECK(parse_count("256M") == 256000000);
  CHECK(parse_count("1.5B") == 1500000000);
  CHECK(parse_count("5e8") == 500000000);
  CHECK(parse_count("1_000") == 1000);
  CHECK(format_bytes(512) == "512 B");
  CHECK(format_bytes(3ull << 29) == "1.50 GiB");
}

TEST_CASE("bad sizes are errors that name the key and the text", "[units][negative]") {
  auto message = [](auto fn) {
    try {
      fn();
    } catch (const Error& e) {
      CHECK(e.code() == Errc::invalid_argument);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(message([] { parse_bytes("8GB x", "memory_budget.device"); }), Catch::Contains("memory_budget.device"));
  CHECK_THAT(message([] { parse_bytes("12 parsecs", "--size"); }), Catch::Contains("unknown unit"));
  CHECK_THAT(message([] { parse_bytes("-1", "--size"); }), Catch::Contains("non-negative"));
  CHECK_THAT(message([] { parse_bytes("", "--size"); }), Catch::Contains("empty"));
  CHECK_THAT(message([] { parse_bytes("0.3", "--size"); }), Catch::Contains("whole number"));
  CHECK_THAT(message([] { parse_count("3X", "--params"); }), Catch::Contains("--params"));
  CHECK_THAT(message([] { parse_bytes("1e30", "--size"); }), Catch::Contains("too large"));
}
