// The manifest file (format.h): its XXH3 checksum refuses any changed byte, a version-1
// file without one still reads with a warning, and every field is checked by its key.
#include <catch2/catch.hpp>

#include <algorithm>

#include "checkpoint/format.h"
#include "runtime/core/error.h"
#include "tests/support/error_of.h"
#include "tests/support/stderr_capture.h"

namespace strata::checkpoint {
namespace {
using strata::test::error_of;
using test::count_of;
using test::StderrCapture;

// A two-rank, stage-3 manifest: a 2x3 "w" (rank 0 elements 0-3, rank 1 elements 4-5) and a
// 4-element "b" (rank 1), with a loss scaler in the engine's state.
Manifest manifest() {
  std::vector<Manifest> p(2);
  for (int r = 0; r < 2; ++r) {
    p[r].step = 7;
    p[r].world_size = 2;
    p[r].zero_stage = 3;
    p[r].compute_dtype = "bf16";
    p[r].engine_state = R"({"loss_scaler": {"scale": 65536.0}, "steps_taken": 7})";
    p[r].trainer_state = R"({"next_step": 7})";
    p[r].tensors = {{"w", {2, 3}, 6, {}}, {"b", {4}, 4, {}}};
    p[r].files = {{shard_file_name(r), r, r == 0 ? 48u : 72u, {11u + 11u * r}}};
  }
  for (int s = 0; s < kStates; ++s) {
    p[0].tensors[0].states[s] = {{0, std::uint64_t(s) * 16, 0, 4}};
    p[1].tensors[0].states[s] = {{0, std::uint64_t(s) * 24, 4, 2}};
    p[1].tensors[1].states[s] = {{0, std::uint64_t(s) * 24 + 8, 0, 4}};
  }
  return merge_parts(p);
}

// `text` with its only occurrence of `from` replaced by `to`.
std::string with(std::string text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  REQUIRE(at != std::string::npos);
  REQUIRE(text.find(from, at + 1) == std::string::npos);
  return text.replace(at, from.size(), to);
}

TEST_CASE("a manifest file opens with its checksum and reads back as written", "[checkpoint][interface]") {
  const Manifest m = manifest();
  const std::string file = manifest_file_text(m);
  CHECK(file.rfind("{\n \"xxh3\": \"", 0) == 0);
  CHECK(file.find("\"version\": 2") != std::string::npos);
  const Manifest back = parse_manifest_file(file, "d/manifest.json");
  CHECK(to_json(back) == to_json(m));
  CHECK(manifest_file_text(back) == file);
}

// Before version 2 nothing protected the manifest: each edit below reads as a valid,
// different checkpoint (another data offset, step, loss scale or data position).
TEST_CASE("one changed digit anywhere in a manifest file is refused by its checksum", "[checkpoint][regression]") {
  const std::string file = manifest_file_text(manifest());
  const auto [from, to] = GENERATE(table<std::string, std::string>({
      {"      56,", "      16,"},                    // b's exp_avg_sq offset in rank00001.bin
      {"\"step\": 7,", "\"step\": 8,"},              // the step
      {"\"scale\": 65536.0", "\"scale\": 65537.0"},  // the loss scale in the engine's state
      {"\"next_step\": 7", "\"next_step\": 3"},      // the trainer's data position
      {"\"zero_stage\": 3", "\"zero_stage\": 2"},
  }));
  CAPTURE(from, to);
  const std::string edited = with(file, from, to);
  parse_manifest(edited, "d/manifest.json");  // still a valid manifest: only the checksum tells
  const std::string msg = error_of([&] { parse_manifest_file(edited, "d/manifest.json"); });
  CHECK_THAT(msg, Catch::Contains("checkpoint manifest d/manifest.json fails its XXH3 checksum"));
  CHECK_THAT(msg, Catch::Contains("the file was changed or damaged after it was written; load another checkpoint"));
}

TEST_CASE("a changed checksum, a removed checksum line or a rewritten file is refused", "[checkpoint][regression]") {
  const std::string file = manifest_file_text(manifest());
  std::string sum = file;
  sum[13] = sum[13] == '0' ? '1' : '0';
  CHECK_THAT(error_of([&] { parse_manifest_file(sum, "m.json"); }), Catch::Contains("fails its XXH3 checksum"));
  sum[13] = 'g';
  CHECK_THAT(error_of([&] { parse_manifest_file(sum, "m.json"); }), Catch::Contains("'xxh3' is not 16 hex digits"));
  // to_json's text is what another tool writing the JSON back would give: no checksum first.
  CHECK_THAT(error_of([&] { parse_manifest_file(to_json(manifest()), "m.json"); }),
             Catch::Contains("is format version 2 but does not open with its 'xxh3' checksum"));
  CHECK_THAT(error_of([&] { parse_manifest_file(file.substr(0, 20), "m.json"); }),
             Catch::Contains("has a damaged 'xxh3' line"));
}

TEST_CASE("a version-1 manifest file (no checksum) still reads, with one warning", "[checkpoint][interface]") {
  Manifest v1 = manifest();
  v1.version = 1;
  StderrCapture log;
  const Manifest back = parse_manifest_file(to_json(v1), "old/manifest.json");
  const std::string text = log.text();
  CHECK(back.version == 1);
  CHECK(back.step == 7);
  CHECK_THAT(text, Catch::Contains("checkpoint manifest old/manifest.json is format version 1 (written by an earlier "
                                   "Strata) and carries no checksum"));
  CHECK(count_of(text, "warning") == 1);
}

// Each field out of its range used to pass parse_manifest (or fail later, elsewhere, with
// no key named): a negative step, stage 7, an unknown dtype, a file name leaving the
// checkpoint directory, a rank outside the world, state that is not an object.
TEST_CASE("every manifest field out of range is refused naming its key", "[checkpoint][regression]") {
  const std::string good = to_json(manifest());
  const auto [from, to, says] = GENERATE(table<std::string, std::string, std::string>({
      {"\"step\": 7", "\"step\": -7", "'step' is -7 but must be >= 0"},
      {"\"world_size\": 2", "\"world_size\": 0", "'world_size' is 0 but must be >= 1"},
      {"\"zero_stage\": 3", "\"zero_stage\": 7", "'zero_stage' is 7 but must be 0, 1, 2 or 3"},
      {"\"compute_dtype\": \"bf16\"", "\"compute_dtype\": \"bf61\"", "'compute_dtype' is 'bf61' but must be fp32"},
      {"\"chunk_bytes\": 1048576", "\"chunk_bytes\": 0", "'chunk_bytes' is 0 but must be in 1 to 2^30"},
      {"\"chunk_bytes\": 1048576", "\"chunk_bytes\": 2147483648", "'chunk_bytes' is 2147483648"},
      {"\"version\": 2", "\"version\": 0", "has format version 0; this Strata reads versions 1 to 5"},
      {"\"rank00001.bin\"", "\"../rank00001.bin\"", "file name \"../rank00001.bin\" is not a plain file name"},
      {"\"rank00001.bin\"", "\"\"", "file name \"\" is not a plain file name"},
      {"\"rank00001.bin\"", "\"manifest.json\"", "file name \"manifest.json\" is not a plain file name"},
      {"\"rank00001.bin\"", "\"rank\\u0000.bin\"", "file name \"rank\\u0000.bin\" is not a plain file name"},
      {"\"rank00001.bin\"", "\"rank00000.bin\"", "file rank00000.bin is listed twice"},
      {"\"rank\": 1", "\"rank\": 2", "file rank00001.bin has 'rank' 2 outside the world of 2"},
      {"\"rank\": 1", "\"rank\": -1", "file rank00001.bin has 'rank' -1 outside the world of 2"},
      {"\"engine\": {", "\"engine\": 5, \"x\": {", "'engine' is not a JSON object (number)"},
      {"\"trainer\": {\n  \"next_step\": 7\n }", "\"trainer\": [7]", "'trainer' is not a JSON object (array)"},
      {"\"name\": \"b\"", "\"name\": \"w\"", "tensor 'w' is listed twice"},
      {"\"name\": \"b\"", "\"name\": \"\"", "a tensor has an empty 'name'"},
      {"\"numel\": 4", "\"numel\": 5", "tensor 'b' has 5 elements but its shape holds 4"},
  }));
  CAPTURE(from, to);
  CHECK_THAT(error_of([&] { parse_manifest(with(good, from, to), "d/manifest.json"); }),
             Catch::Contains("checkpoint manifest d/manifest.json") && Catch::Contains(says));
}

TEST_CASE("a negative dim, a non-array file list and a mis-counted checksum list are refused",
          "[checkpoint][regression]") {
  Manifest neg = manifest();
  neg.tensors[1].shape = {-2, -2};
  CHECK_THAT(error_of([&] { parse_manifest(to_json(neg), "m.json"); }),
             Catch::Contains("tensor 'b' has a negative dim"));
  const std::string good = to_json(manifest());
  const auto files = good.find("\"files\": [");
  REQUIRE(files != std::string::npos);
  std::string obj = good;
  obj.replace(files, 10, "\"files\": 3, \"y\": [");
  CHECK_THAT(error_of([&] { parse_manifest(obj, "m.json"); }), Catch::Contains("'files' is not an array (number)"));
  Manifest sums = manifest();
  sums.files[1].xxh3.push_back(5);
  CHECK_THAT(error_of([&] { parse_manifest(to_json(sums), "m.json", true); }),
             Catch::Contains("file rank00001.bin has 2 checksums for 1 chunks"));
}

TEST_CASE("one rank's part carries no checksum and is checked but for tiling", "[checkpoint][interface]") {
  Manifest part = manifest();
  part.files.erase(part.files.begin());  // rank 1's part: its file only, w's rank-0 segments gone
  for (auto& t : part.tensors)
    for (auto& s : t.states) {
      s.erase(std::remove_if(s.begin(), s.end(), [](const Segment& g) { return g.file == 0; }), s.end());
      for (auto& g : s) g.file = 0;
    }
  const std::string text = to_json(part);
  CHECK(text.find("\"xxh3\": \"") == std::string::npos);
  CHECK(parse_manifest(text, "rank 1's part", true).files.size() == 1);
  CHECK_THAT(error_of([&] { parse_manifest(text, "m.json"); }), Catch::Contains("has no data for elements from 0"));
}

}  // namespace
}  // namespace strata::checkpoint
