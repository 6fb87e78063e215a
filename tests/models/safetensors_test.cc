// The safetensors reader against damaged headers (found by fuzz/safetensors_fuzz.cc): a
// header or __metadata__ that is not an object, dimensions that are negative, fractional or
// whose product wraps, and offsets that wrap past the file's end are refused with a
// strata::Error naming the file, never a crash or a huge allocation; and the writer refuses
// a path that is a directory before it writes anything.
#include <catch2/catch.hpp>

#include <cstdint>
#include <fstream>
#include <string>

#include "models/safetensors.h"
#include "runtime/core/error.h"
#include "tests/support/error_of.h"
#include "tests/support/temp_dir.h"

using namespace strata;
using namespace strata::model;

namespace {

// A file of the 8-byte header length, `header` and `data` bytes.
std::string file_with(const strata::test::TempDir& dir, const std::string& header, std::size_t data = 16) {
  const std::string path = dir.file("t.safetensors");
  std::ofstream out(path, std::ios::binary);
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>(static_cast<std::uint64_t>(header.size()) >> (8 * i)));
  out << header << std::string(data, '\0');
  return path;
}

std::string error_reading(const std::string& path) {
  return strata::test::error_of([&] { read_safetensors(path); });
}

}  // namespace

TEST_CASE("safetensors files round-trip", "[models][safetensors]") {
  strata::test::TempDir dir("strata-safetensors-test");
  const std::string path = dir.file("w.safetensors");
  write_safetensors(path, {{"w", {2, 3}, {1, 2, 3, 4, 5, 6}}, {"s", {}, {7}}}, {{"format", "pt"}});
  const auto back = read_safetensors(path);
  REQUIRE(back.size() == 2);
  CHECK(back[0].shape == std::vector<std::int64_t>{2, 3});
  CHECK(back[0].data[5] == 6.0f);
  CHECK(back[1].data == std::vector<float>{7});
}

TEST_CASE("a safetensors output that is a directory is refused before anything is written",
          "[models][safetensors][negative]") {
  strata::test::TempDir dir("strata-safetensors-test");
  const std::string path = dir.path();
  CHECK_THAT(strata::test::error_of([&] {
               write_safetensors(path, {{"w", {1}, {1}}}, {});
             }),
             Catch::Contains("is a directory: give the safetensors file's path"));
  CHECK_FALSE(std::ifstream(path + ".tmp").good());
}

TEST_CASE("safetensors headers that are damaged are refused naming the file", "[models][safetensors][negative]") {
  strata::test::TempDir dir("strata-safetensors-test");
  const auto entry = [](const std::string& shape, const std::string& offsets) {
    return R"({"t": {"dtype": "F32", "shape": )" + shape + R"(, "data_offsets": )" + offsets + "}}";
  };
  CHECK_THAT(error_reading(file_with(dir, "[1, 2]")), Catch::Contains("the header is a JSON array, not an object"));
  CHECK_THAT(error_reading(file_with(dir, R"({"__metadata__": 5})")),
             Catch::Contains("__metadata__ is a JSON number, not an object of strings"));
  CHECK_THAT(error_reading(file_with(dir, R"({"t": 5})")), Catch::Contains("tensor 't' has a malformed entry"));
  // [-1, -1] held one element (the product of the wrapped dimensions).
  CHECK_THAT(error_reading(file_with(dir, entry("[-1, -1]", "[0, 4]"))),
             Catch::Contains("tensor 't' has a shape with -1 in it"));
  CHECK_THAT(error_reading(file_with(dir, entry("[1e300]", "[0, 4]"))), Catch::Contains("has a shape with 1e+300"));
  // 2^62 fp32 elements are 2^64 bytes, which wrapped to 0 and matched empty offsets.
  CHECK_THAT(error_reading(file_with(dir, entry("[4611686018427387904]", "[0, 0]"))),
             Catch::Contains("has a shape too large for 64 bits"));
  CHECK_THAT(error_reading(file_with(dir, entry("[1]", "[18446744073709551608, 18446744073709551612]"))),
             Catch::Contains("lie past the end of the file"));
  CHECK_THAT(error_reading(file_with(dir, entry("[1]", "[0, -4]"))),
             Catch::Contains("has data_offsets that are not [begin, end]"));
}
