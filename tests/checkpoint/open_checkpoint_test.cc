// Opening a checkpoint (directory.h): `latest` and `manifest.json` are read bounded and
// never waited on (a FIFO, /dev/zero, a huge file are refused by path), and a root whose
// `latest` cannot be used loads its newest complete checkpoint with one warning.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>

#include "checkpoint/directory.h"
#include "checkpoint/shard_file.h"
#include "runtime/core/error.h"
#include "tests/support/error_of.h"
#include "tests/support/stderr_capture.h"
#include "tests/support/temp_dir.h"

namespace strata::checkpoint {
namespace {
using strata::test::error_of;
using strata::test::TempDir;
using test::count_of;
using test::StderrCapture;
namespace fs = std::filesystem;

// Stages and commits a one-tensor checkpoint of `step`.
void save(const std::string& root, std::int64_t step) {
  const std::string dir = prepare_save(root, step);
  Manifest m;
  m.step = step;
  m.tensors = {{"x", {4}, 4, {}}};
  ShardWriter w(dir + "/rank00000.bin", m.chunk_bytes);
  const std::vector<float> v(4, static_cast<float>(step));
  for (int s = 0; s < kStates; ++s) m.tensors[0].states[s] = {{0, w.append(v.data(), 16), 0, 4}};
  m.files.push_back(w.finish("rank00000.bin", 0));
  commit_save(root, m, 0);
}

// The error open_checkpoint(path) gives ("" when it opens), or "hung" when it has not
// returned within 10 s (it takes milliseconds; the bound only tells a hang from a busy machine). A hung open of a FIFO
// is released by opening the FIFO for reading and writing ourselves (which never blocks), so a failing test ends.
std::string open_error_in_time(const std::string& path, const std::string& fifo) {
  auto done = std::async(std::launch::async, [&] { return error_of([&] { open_checkpoint(path); }); });
  if (done.wait_for(std::chrono::seconds(10)) == std::future_status::ready) return done.get();
  const int fd = ::open(fifo.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (fd >= 0) ::close(fd);
  done.wait();
  return "hung";
}

void write(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::trunc) << text; }

// Before: open() of a FIFO `latest` or `manifest.json` blocked train, verify and export
// until something wrote to it.
TEST_CASE("a FIFO as latest or as manifest.json is refused at once, naming it", "[checkpoint][regression]") {
  TempDir tmp("ckpt-open");
  const std::string root = tmp.file("run");
  fs::create_directory(root);
  REQUIRE(::mkfifo((root + "/latest").c_str(), 0644) == 0);
  CHECK_THAT(open_error_in_time(root, root + "/latest"),
             Catch::Contains("'" + root + "/latest' is a FIFO, not a regular file"));

  save(tmp.file("run2"), 1);
  const std::string step = tmp.file("run2") + "/step-00000001";
  fs::remove(step + "/manifest.json");
  REQUIRE(::mkfifo((step + "/manifest.json").c_str(), 0644) == 0);
  CHECK_THAT(open_error_in_time(step, step + "/manifest.json"),
             Catch::Contains("'" + step + "/manifest.json' is a FIFO, not a regular file"));
  CHECK_THAT(open_error_in_time(tmp.file("run2"), step + "/manifest.json"),
             Catch::Contains("manifest.json' is a FIFO, not a regular file"));
}

// Before: a `latest` linked to /dev/zero was read until memory ran out.
TEST_CASE("a latest or manifest.json linked to a device, or too large, is refused", "[checkpoint][regression]") {
  TempDir tmp("ckpt-open");
  const std::string root = tmp.file("run");
  fs::create_directory(root);
  fs::create_symlink("/dev/zero", root + "/latest");
  CHECK_THAT(error_of([&] { open_checkpoint(root); }),
             Catch::Contains("'" + root + "/latest' is a character device, not a regular file"));
  fs::remove(root + "/latest");
  fs::create_directory(root + "/latest");
  CHECK_THAT(error_of([&] { open_checkpoint(root); }), Catch::Contains("latest' is a directory, not a regular file"));
  fs::remove(root + "/latest");
  write(root + "/latest", "step-00000001\n" + std::string(5000, ' '));
  CHECK_THAT(error_of([&] { open_checkpoint(root); }),
             Catch::Contains("latest' holds 5014 bytes, more than the 4096 a save ever writes there"));

  save(tmp.file("run2"), 1);
  const std::string step = tmp.file("run2") + "/step-00000001";
  fs::remove(step + "/manifest.json");
  fs::create_symlink("/dev/zero", step + "/manifest.json");
  CHECK_THAT(error_of([&] { open_checkpoint(step); }), Catch::Contains("manifest.json' is a character device"));
  fs::remove(step + "/manifest.json");
  write(step + "/manifest.json", "{}");
  fs::resize_file(step + "/manifest.json", (std::uint64_t{256} << 20) + 1);  // sparse: no disk used
  CHECK_THAT(error_of([&] { open_checkpoint(step); }),
             Catch::Contains("manifest.json' holds 268435457 bytes, more than the 268435456"));
}

TEST_CASE("a committed manifest carries its checksum and a changed one is refused by path",
          "[checkpoint][regression]") {
  TempDir tmp("ckpt-open");
  const std::string root = tmp.file("run");
  save(root, 4);
  const std::string path = root + "/step-00000004/manifest.json";
  std::string text;
  {
    std::ifstream in(path);
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  REQUIRE(text.rfind("{\n \"xxh3\": \"", 0) == 0);
  text.replace(text.find("\"step\": 4"), 9, "\"step\": 5");
  write(path, text);
  CHECK_THAT(error_of([&] { open_checkpoint(root + "/step-00000004"); }),
             Catch::Contains("checkpoint manifest " + path + " fails its XXH3 checksum"));
}

// Each way `latest` can fail to name a complete checkpoint; before, each was an error
// although complete checkpoints sat beside it.
TEST_CASE("a root whose latest cannot be used loads its newest complete checkpoint, with one warning",
          "[checkpoint][regression]") {
  struct Case {
    const char* what;
    std::function<void(const std::string&)> damage;
    std::int64_t loads;
    const char* says;
  };
  const std::vector<Case> cases = {
      {"missing", [](const std::string& r) { fs::remove(r + "/latest"); }, 3, "it has no 'latest' file"},
      {"empty", [](const std::string& r) { write(r + "/latest", ""); }, 3, "latest' is empty"},
      {"a FIFO",
       [](const std::string& r) {
         fs::remove(r + "/latest");
         REQUIRE(::mkfifo((r + "/latest").c_str(), 0644) == 0);
       },
       3, "latest' is a FIFO"},
      {"a directory",
       [](const std::string& r) {
         fs::remove(r + "/latest");
         fs::create_directory(r + "/latest");
       },
       3, "latest' is a directory"},
      {"no step", [](const std::string& r) { write(r + "/latest", "../elsewhere\n"); }, 3,
       "names '../elsewhere', which is not a step directory"},
      {"binary", [](const std::string& r) { write(r + "/latest", std::string("step-1\n\0\x7f\x01x", 11)); }, 3,
       "names 'step-1??\x7f?x', which is not a step directory"},
      {"a missing step", [](const std::string& r) { write(r + "/latest", "step-00000009\n"); }, 3,
       "names step-00000009, which does not exist"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.what);
    TempDir tmp("ckpt-open");
    const std::string root = tmp.file("run");
    for (int s = 1; s <= 3; ++s) save(root, s);
    c.damage(root);
    StderrCapture log;
    std::int64_t step = -1;
    const std::string err = error_of([&] { step = open_checkpoint(root).manifest.step; });
    const std::string text = log.text();
    CHECK(err.empty());
    CHECK(step == c.loads);
    CHECK(count_of(text, "warning") == 1);
    CHECK_THAT(text, Catch::Contains("not using 'latest' under '" + root + "'") && Catch::Contains(c.says) &&
                         Catch::Contains(str_cat("loading ", step_dir_name(c.loads), " (step ", c.loads, ")")));
  }
}

// What `latest` names is the checkpoint asked for: its damage is named, never hidden by
// loading an older checkpoint (which a later save of the same step would then replace).
TEST_CASE("a damaged checkpoint that latest names is an error, not a fallback", "[checkpoint][negative]") {
  const auto damage_manifest = [](const std::string& root) {
    write(root + "/step-00000003/manifest.json", "{\n \"xxh3\": \"0000000000000000\",\n \"step\": 3\n}\n");
  };
  const std::vector<std::pair<std::function<void(const std::string&)>, const char*>> cases = {
      {[](const std::string& r) { fs::remove(r + "/step-00000003/manifest.json"); },
       "names step-00000003, which has no manifest.json: it was damaged after its save"},
      {damage_manifest, "step-00000003/manifest.json fails its XXH3 checksum"},
  };
  for (const auto& [damage, says] : cases) {
    CAPTURE(says);
    TempDir tmp("ckpt-open");
    const std::string root = tmp.file("run");
    for (int s = 1; s <= 3; ++s) save(root, s);
    damage(root);
    CHECK_THAT(error_of([&] { open_checkpoint(root); }), Catch::Contains(says));
  }
}

TEST_CASE("a good latest is followed even when a newer checkpoint exists, without a warning", "[checkpoint]") {
  TempDir tmp("ckpt-open");
  const std::string root = tmp.file("run");
  for (int s = 1; s <= 3; ++s) save(root, s);
  write(root + "/latest", "step-00000002\n");
  StderrCapture log;
  CHECK(open_checkpoint(root).manifest.step == 2);
  CHECK(log.text().empty());
}

TEST_CASE("a step directory given explicitly never falls back; no complete checkpoint is latest's error",
          "[checkpoint][negative]") {
  TempDir tmp("ckpt-open");
  const std::string root = tmp.file("run");
  for (int s = 1; s <= 2; ++s) save(root, s);
  fs::remove(root + "/step-00000002/manifest.json");
  CHECK_THAT(error_of([&] { open_checkpoint(root + "/step-00000002"); }),
             Catch::Contains("has no manifest.json: the save that wrote it did not complete"));
  write(root + "/step-00000002/manifest.json", "{}");
  CHECK_THAT(error_of([&] { open_checkpoint(root + "/step-00000002"); }),
             Catch::Contains("is format version") || Catch::Contains("has no 'format'"));
  fs::remove(root + "/step-00000001/manifest.json");
  CHECK_THAT(error_of([&] { open_checkpoint(root); }), Catch::Contains("run/step-00000002/manifest.json"));
  fs::remove(root + "/latest");
  CHECK_THAT(error_of([&] { open_checkpoint(root); }), Catch::Contains("no save has completed there"));
}

}  // namespace
}  // namespace strata::checkpoint
