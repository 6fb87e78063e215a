// The manifest: its JSON round trip, the merge of rank parts, and the validation that
// refuses a manifest whose segments do not tile every tensor exactly.
#include <catch2/catch.hpp>

#include "checkpoint/format.h"
#include "runtime/core/error.h"
#include "tests/support/error_of.h"

namespace strata::checkpoint {
namespace {
using test::error_of;

// Two ranks' parts of a 2x3 tensor "w" (rank 0 elements 0-3, rank 1 elements 4-5) and a
// 4-element "b" (rank 1 only).
std::vector<Manifest> parts() {
  std::vector<Manifest> p(2);
  for (int r = 0; r < 2; ++r) {
    p[r].step = 7;
    p[r].world_size = 2;
    p[r].zero_stage = 3;
    p[r].engine_state = R"({"steps_taken": 7})";
    p[r].trainer_state = R"({"next_step": 7})";
    p[r].tensors = {{"w", {2, 3}, 6, {}}, {"b", {4}, 4, {}}};
  }
  for (int s = 0; s < kStates; ++s) {
    p[0].tensors[0].states[s] = {{0, std::uint64_t(s) * 16, 0, 4}};
    p[1].tensors[0].states[s] = {{0, std::uint64_t(s) * 24, 4, 2}};
    p[1].tensors[1].states[s] = {{0, std::uint64_t(s) * 24 + 8, 0, 4}};
  }
  p[0].files = {{"rank00000.bin", 0, 48, {11}}};
  p[1].files = {{"rank00001.bin", 1, 72, {22}}};
  return p;
}

TEST_CASE("a merged manifest round-trips through JSON and tiles every tensor", "[checkpoint]") {
  const Manifest m = merge_parts(parts());
  REQUIRE(m.files.size() == 2);
  CHECK(m.tensors[0].states[1].size() == 2);
  CHECK(m.tensors[0].states[1][1].file == 1);  // rank 1's segment points at rank 1's file
  const Manifest back = parse_manifest(to_json(m), "test");
  CHECK(back.step == 7);
  CHECK(back.world_size == 2);
  CHECK(back.find("b") != nullptr);
  CHECK(back.find("b")->states[2][0].file_offset == 56);
  CHECK(back.payload_bytes() == 120);
  CHECK(back.trainer_state == R"({"next_step":7})");
  CHECK(to_json(back) == to_json(m));
}

TEST_CASE("a manifest with a gap, an overlap or a segment outside its file is refused by name", "[checkpoint]") {
  auto p = parts();
  Manifest gap = merge_parts(p);
  gap.tensors[0].states[2][1].elem = 5;  // elements 4 missing
  gap.tensors[0].states[2][1].count = 1;
  CHECK_THAT(error_of([&] { parse_manifest(to_json(gap), "m.json"); }),
             Catch::Contains("tensor 'w' (exp_avg_sq) has no data for elements from 4"));
  Manifest overlap = merge_parts(p);
  overlap.tensors[0].states[0][1].elem = 3;
  overlap.tensors[0].states[0][1].count = 3;
  CHECK_THAT(error_of([&] { parse_manifest(to_json(overlap), "m.json"); }),
             Catch::Contains("tensor 'w' (master) has overlapping segments at element 3"));
  Manifest outside = merge_parts(p);
  outside.tensors[1].states[1][0].file_offset = 70;
  CHECK_THAT(error_of([&] { parse_manifest(to_json(outside), "m.json"); }),
             Catch::Contains("tensor 'b' (exp_avg) has a segment outside rank00001.bin"));
  Manifest sums = merge_parts(p);
  sums.chunk_bytes = 16;
  CHECK_THAT(error_of([&] { parse_manifest(to_json(sums), "m.json"); }),
             Catch::Contains("file rank00000.bin has 1 checksums for 3 chunks"));
}

TEST_CASE("a damaged, foreign or newer manifest is refused naming the file", "[checkpoint]") {
  const std::string good = to_json(merge_parts(parts()));
  CHECK_THAT(error_of([&] { parse_manifest(good.substr(0, good.size() / 2), "d/manifest.json"); }),
             Catch::Contains("checkpoint manifest d/manifest.json is not valid JSON"));
  std::string newer = good;
  newer.replace(newer.find("\"version\": 2"), 12, "\"version\": 9");
  CHECK_THAT(error_of([&] { parse_manifest(newer, "d/manifest.json"); }),
             Catch::Contains("has format version 9; this Strata reads versions 1 to 5"));
  CHECK_THAT(error_of([&] { parse_manifest(R"({"format": "pytorch"})", "x"); }),
             Catch::Contains("is not a Strata checkpoint"));
  std::string no_step = good;
  no_step.replace(no_step.find("\"step\""), 6, "\"stop\"");
  CHECK_THAT(error_of([&] { parse_manifest(no_step, "x"); }), Catch::Contains("the manifest has no 'step'"));
}

// Found by fuzz/manifest_fuzz.cc: numbers that nlohmann would convert with undefined
// behaviour or wrap (a float, a negative or out-of-range integer), sums that wrapped past
// the segment check, and nesting deep enough to overflow the stack when dumped or copied.
TEST_CASE("a manifest with numbers out of range, wrapping segments or deep nesting is refused", "[checkpoint]") {
  const std::string good = to_json(merge_parts(parts()));
  const auto with = [&](const std::string& from, const std::string& to) {
    std::string text = good;
    const auto at = text.find(from);
    REQUIRE(at != std::string::npos);
    return text.replace(at, from.size(), to);
  };
  CHECK_THAT(error_of([&] { parse_manifest(with("\"version\": 2", "\"version\": 2e300"), "x"); }),
             Catch::Contains("the manifest 'version' has the wrong type or is out of range (number)"));
  CHECK_THAT(error_of([&] { parse_manifest(with("\"world_size\": 2", "\"world_size\": 4294967298"), "x"); }),
             Catch::Contains("'world_size' has the wrong type or is out of range"));
  CHECK_THAT(error_of([&] { parse_manifest(with("\"chunk_bytes\": 1048576", "\"chunk_bytes\": -1"), "x"); }),
             Catch::Contains("'chunk_bytes' has the wrong type or is out of range"));
  CHECK_THAT(error_of([&] { parse_manifest(with("\"numel\": 6", "\"numel\": 6.5"), "x"); }),
             Catch::Contains("'numel' has the wrong type or is out of range"));
  // A segment of 2^62 elements: count * 4 wrapped to 0 and passed the file-size check.
  Manifest wrap = merge_parts(parts());
  wrap.tensors[1].states[0][0].count = std::uint64_t{1} << 62;
  CHECK_THAT(error_of([&] { parse_manifest(to_json(wrap), "m.json", true); }),
             Catch::Contains("tensor 'b' (master) has a segment outside rank00001.bin"));
  // File 2^32 + 1 was read as int 1, a file that exists.
  CHECK_THAT(error_of([&] { parse_manifest(with("      1,\n      8,\n", "      4294967297,\n      8,\n"), "x"); }),
             Catch::Contains("tensor 'b' master has a segment that is not [file, offset, elem, count]"));
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  CHECK_THAT(error_of([&] { parse_manifest(with("{\n  \"steps_taken\": 7\n }", deep), "x"); }),
             Catch::Contains("checkpoint manifest x nests deeper than 128 levels"));
}

TEST_CASE("step directory names", "[checkpoint]") {
  CHECK(step_dir_name(12) == "step-00000012");
  CHECK(step_of_dir_name("step-00000012") == 12);
  CHECK(step_of_dir_name("step-123456789") == 123456789);
  CHECK(step_of_dir_name("step-") == -1);
  CHECK(step_of_dir_name("step-12a") == -1);
  CHECK(step_of_dir_name(".step-00000012.tmp") == -1);
}

}  // namespace
}  // namespace strata::checkpoint
