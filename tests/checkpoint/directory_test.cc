// The directory protocol: a staged save becomes visible only at commit, `latest` follows
// it, retention keeps the newest K (never latest), a re-saved step replaces the old one
// whole, leftovers of crashed saves are cleared, and opening names what is missing.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "checkpoint/directory.h"
#include "checkpoint/shard_file.h"
#include "runtime/core/error.h"
#include "tests/support/error_of.h"
#include "tests/support/temp_dir.h"

namespace strata::checkpoint {
namespace {
using test::error_of;
namespace fs = std::filesystem;

// Stages and commits a one-tensor checkpoint of `step` whose values are all `value`.
std::string save(const std::string& root, std::int64_t step, float value, int keep) {
  const std::string dir = prepare_save(root, step);
  Manifest m;
  m.step = step;
  m.tensors = {{"x", {4}, 4, {}}};
  ShardWriter w(dir + "/rank00000.bin", m.chunk_bytes);
  const std::vector<float> v(4, value);
  for (int s = 0; s < kStates; ++s) m.tensors[0].states[s] = {{0, w.append(v.data(), 16), 0, 4}};
  m.files.push_back(w.finish("rank00000.bin", 0));
  return commit_save(root, m, keep);
}

float value_of(const std::string& path) {
  const auto o = open_checkpoint(path);
  ShardReader r(o.dir, o.manifest);
  float v = 0;
  r.read_tensor(o.manifest.tensors[0], State::exp_avg, 2, 1, &v);
  return v;
}

TEST_CASE("commit makes a save visible, latest follows it and retention keeps the newest", "[checkpoint]") {
  test::TempDir tmp("ckpt-dir");
  const std::string root = tmp.file("run");
  CHECK_THAT(error_of([&] { open_checkpoint(tmp.path()); }), Catch::Contains("has no 'latest' file"));
  prepare_save(root, 1);  // staged, never committed: not a checkpoint
  CHECK(list_checkpoints(root).empty());
  CHECK_THAT(error_of([&] { open_checkpoint(root); }), Catch::Contains("no save has completed there"));
  for (int s = 1; s <= 5; ++s) save(root, s, static_cast<float>(s), 2);
  CHECK(list_checkpoints(root) == std::vector<std::int64_t>{4, 5});
  CHECK(value_of(root) == 5.0f);
  CHECK(open_checkpoint(root).dir == root + "/step-00000005");
  CHECK(value_of(root + "/step-00000004") == 4.0f);
  for (const auto& e : fs::directory_iterator(root)) {
    const auto n = e.path().filename().string();
    CHECK((n == "latest" || n == "step-00000004" || n == "step-00000005"));
  }
}

TEST_CASE("a step saved again replaces the old one whole; crashed saves' leftovers go", "[checkpoint]") {
  test::TempDir tmp("ckpt-dir");
  const std::string root = tmp.file("run");
  save(root, 3, 3.0f, 0);
  save(root, 6, 6.0f, 0);
  // A run resumed from step 3 saves step 6 again: the new one replaces it, latest names it.
  fs::create_directory(root + "/.step-00000009.tmp");  // a crashed save of step 9
  save(root, 6, 60.0f, 0);
  CHECK(value_of(root) == 60.0f);
  CHECK(list_checkpoints(root) == std::vector<std::int64_t>{3, 6});
  CHECK_FALSE(fs::exists(root + "/.step-00000009.tmp"));
  CHECK_FALSE(fs::exists(root + "/.step-00000006.tmp"));
}

TEST_CASE("opening names a missing manifest, a bad latest and a non-directory", "[checkpoint]") {
  test::TempDir tmp("ckpt-dir");
  const std::string root = tmp.file("run");
  save(root, 2, 2.0f, 0);
  fs::remove(root + "/step-00000002/manifest.json");
  CHECK_THAT(error_of([&] { open_checkpoint(root); }),
             Catch::Contains("run/latest' names step-00000002, which has no manifest.json"));
  CHECK_THAT(error_of([&] { open_checkpoint(root + "/step-00000002"); }),
             Catch::Contains("has no manifest.json: the save that wrote it did not complete"));
  std::ofstream(root + "/latest") << "../elsewhere\n";
  CHECK_THAT(error_of([&] { open_checkpoint(root); }), Catch::Contains("names '../elsewhere', which is not a step"));
  CHECK_THAT(error_of([&] { open_checkpoint(root + "/latest"); }), Catch::Contains("is not a directory"));
}

}  // namespace
}  // namespace strata::checkpoint
