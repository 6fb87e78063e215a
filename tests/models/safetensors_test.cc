// The safetensors reader against damaged headers (found by fuzz/safetensors_fuzz.cc): a
// header or __metadata__ that is not an object, dimensions that are negative, fractional or
// whose product wraps, and offsets that wrap past the file's end are refused with a
// strata::Error naming the file, never a crash or a huge allocation; so is each breach of the
// format's rules that Hugging Face's reader enforces (header bound, duplicate keys, dtypes,
// offsets that tile the data); and the writer refuses a path that is a directory before it
// writes anything.
#include <sys/stat.h>
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

// A file of the 8-byte header length (`length`, or the header's), `header` and `data` bytes.
std::string file_with(const strata::test::TempDir& dir, const std::string& header, std::size_t data = 16,
                      std::uint64_t length = 0) {
  const std::string path = dir.file("t.safetensors");
  std::ofstream out(path, std::ios::binary);
  if (length == 0) length = header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>(length >> (8 * i)));
  out << header << std::string(data, '\0');
  return path;
}

// An F32 entry named `name` of `shape` at `offsets`, as header text (without braces).
std::string f32(const std::string& name, const std::string& shape, const std::string& offsets) {
  return "\"" + name + R"(": {"dtype": "F32", "shape": )" + shape + R"(, "data_offsets": )" + offsets + "}";
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
             Catch::Contains("tensor 't' has data_offsets [18446744073709551608, 18446744073709551612] that lie past "
                             "the end of the file"));
  CHECK_THAT(error_reading(file_with(dir, entry("[1]", "[0, -4]"))),
             Catch::Contains("has data_offsets that are not [begin, end]"));
}

TEST_CASE("safetensors headers that break the format's rules are refused naming the file and the tensor",
          "[models][safetensors][negative][regression]") {
  strata::test::TempDir dir("strata-safetensors-test");
  const auto refused = [&](const std::string& header, std::size_t data, const std::string& want) {
    const std::string path = file_with(dir, header, data);
    const std::string e = error_reading(path);
    CHECK_THAT(e, Catch::Contains("'" + path + "'") && Catch::Contains(want));
  };
  // Before the bound, a damaged length asked for a header of that many bytes.
  CHECK_THAT(error_reading(file_with(dir, "{}", 0, 100'000'001)),
             Catch::Contains("header length 100000001 bytes is above safetensors' bound of 100000000 bytes"));
  // nlohmann::json kept the last of two equal keys: the first tensor vanished unread.
  refused("{" + f32("a", "[1]", "[0, 4]") + ", " + f32("a", "[1]", "[4, 8]") + "}", 8,
          "tensor 'a' appears twice in the header");
  refused(R"({"a": {"dtype": "F32", "dtype": "F16", "shape": [1], "data_offsets": [0, 4]}})", 4,
          "tensor 'a' has the key 'dtype' twice");
  refused(R"({"__metadata__": {"k": "1", "k": "2"}})", 0, "__metadata__ has the key 'k' twice");
  CHECK(error_reading(file_with(dir, "{" + f32("a", "[1]", "[0, 4]") + "}", 4)).empty());  // the control
  refused(R"({"a": {"dtype": "F33", "shape": [1], "data_offsets": [0, 4]}})", 4,
          "tensor 'a' has dtype F33, which is not a safetensors dtype");
  refused(R"({"a": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}})", 8,
          "tensor 'a' has dtype I64; Strata reads F32, BF16 and F16");
  refused("{" + f32("a", "[2]", "[8, 0]") + "}", 8, "tensor 'a' has data_offsets [8, 0] that begin after they end");
  refused("{" + f32("a", "[2]", "[0, 4]") + "}", 8,
          "tensor 'a' has data_offsets [0, 4] spanning 4 bytes, but its shape [2] of F32 needs 8");
  refused("{" + f32("a", "[4]", "[0, 16]") + "}", 8, "tensor 'a' has data_offsets [0, 16] that lie past the end");
  // Overlaps, holes and bytes that belong to no tensor (safetensors requires a tiling).
  refused("{" + f32("a", "[2]", "[0, 8]") + ", " + f32("b", "[1]", "[4, 8]") + "}", 8,
          "tensor 'b' (bytes 4-8) overlaps tensor 'a' (bytes 0-8)");
  refused("{" + f32("a", "[1]", "[0, 4]") + ", " + f32("b", "[1]", "[8, 12]") + "}", 12,
          "bytes 4-8 before tensor 'b' belong to no tensor");
  refused("{" + f32("a", "[1]", "[4, 8]") + "}", 8, "bytes 0-4 before tensor 'a' belong to no tensor");
  refused("{" + f32("a", "[1]", "[0, 4]") + "}", 12, "bytes 4-12 of the data region after tensor 'a' belong to no");
  refused(R"({"__metadata__": {"format": 5}})", 0, "__metadata__ entry 'format' is a JSON number, not a string");
  // A name holding a control character is shown escaped: the error stays one line.
  refused(R"({"a\nb": {"dtype": "F33", "shape": [1], "data_offsets": [0, 4]}})", 4, "tensor 'a\\x0ab' has dtype");
}

TEST_CASE("a safetensors path that is a FIFO or a directory is refused without blocking",
          "[models][safetensors][negative][regression]") {
  strata::test::TempDir dir("strata-safetensors-test");
  const std::string fifo = dir.file("f.safetensors");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  // Opened without O_NONBLOCK, this waited forever for a writer.
  CHECK_THAT(error_reading(fifo), Catch::Contains("'" + fifo + "' is not a regular file (a FIFO)"));
  CHECK_THAT(error_reading(dir.path()), Catch::Contains("is not a regular file (a directory)"));
}

TEST_CASE("the safetensors writer refuses two tensors of one name before writing",
          "[models][safetensors][negative][regression]") {
  strata::test::TempDir dir("strata-safetensors-test");
  const std::string path = dir.file("w.safetensors");
  CHECK_THAT(strata::test::error_of([&] {
               write_safetensors(path, {{"w", {1}, {1}}, {"w", {1}, {2}}});
             }),
             Catch::Contains("tensor name 'w' is given twice"));
  CHECK_FALSE(std::ifstream(path + ".tmp").good());
  CHECK_FALSE(std::ifstream(path).good());
}

TEST_CASE("a reader listing other dtypes keeps them apart from the tensors it reads",
          "[models][safetensors][interface]") {
  strata::test::TempDir dir("strata-safetensors-test");
  // An I64 tensor named "" (a valid key) and an F32 one; the I64 still takes part in the
  // tiling check (its 16 bytes come first).
  const std::string header =
      R"({"": {"dtype": "I64", "shape": [2], "data_offsets": [0, 16]}, )" + f32("w", "[1]", "[16, 20]") + "}";
  const std::string path = file_with(dir, header, 20);
  CHECK_THAT(strata::test::error_of([&] { SafetensorsReader r(path); }),
             Catch::Contains("has dtype I64; Strata reads F32"));
  SafetensorsReader r(path, /*list_other_dtypes=*/true);
  REQUIRE(r.tensors().size() == 1);
  CHECK(r.tensors()[0].name == "w");
  REQUIRE(r.other_tensors().size() == 1);
  CHECK(r.other_tensors()[0].name.empty());
  CHECK(r.other_tensors()[0].dtype == "I64");
  CHECK(r.other_tensors()[0].bytes == 16);
  // A hole where the I64's bytes should be is still a hole.
  CHECK_THAT(strata::test::error_of([&] { SafetensorsReader bad(file_with(dir, header, 28), true); }),
             Catch::Contains("belong to no tensor"));
}
