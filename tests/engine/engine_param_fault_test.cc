// Stage-3 parameter offload inside the engine when things go wrong: a corrupted parameter
// swap block fails the gather naming the tensor, file and block; a full device mid-step
// fails the step and keeps the last good state; host, pinned and memory_budget values too
// small are refused at setup naming the minimum; an nvme_path that cannot hold swap files
// is refused naming the key and file, leaving nothing behind; a failed write-back is
// reported without leaking its staging.
#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "runtime/core/error.h"
#include "tests/engine/engine_support.h"
#include "tests/engine/param_offload_support.h"
#include "tests/engine/stack_trainer.h"
#include "tests/support/error_of.h"
#include "tests/support/file_size_limit.h"
#include "tests/support/temp_dir.h"

using namespace strata;

namespace {

using engine::OffloadDevice;
using test::place;
using test::stage3_config;

std::string step_error(test::MlpRank& t, std::int64_t step) {
  return test::error_of([&] { (void)t.mlp->train_step(step); });
}

std::string train_error(const test::TrainSpec& spec) {
  return test::error_of([&] { (void)test::train_mlp(spec); });
}

}  // namespace

TEST_CASE("a corrupted parameter swap block fails the gather naming the tensor, the file and the block",
          "[offload][uring][negative]") {
  test::TempDir dir("strata-offload");
  auto c = stage3_config(1);
  place(c, OffloadDevice::none, OffloadDevice::nvme, dir.path());
  c.aio.block_size = 4096;
  c.offload_param.buffer_size = 4096;  // one chunk per layer: 2112 B in one block
  test::MlpRank t(c);
  (void)t.mlp->train_step(0);
  t.engine->synchronize();  // the step's parameter write-back runs on into the next step
  // Flip a byte of layer 1's shard in both generations (whichever is current is read).
  for (const char* gen : {"a", "b"}) {
    const std::string file = dir.path() + "/rank0/params/layer_1.params.c0." + gen + ".swap";
    REQUIRE(std::filesystem::exists(file));
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8192 + 100);
    f.put('\x5a');
  }
  const std::string m = step_error(t, 1);
  INFO(m);
  CHECK(m.find("parameter shard of layer 1") != std::string::npos);
  CHECK(m.find(dir.path() + "/rank0/params/layer_1.params.c0.") != std::string::npos);
  CHECK(m.find("block 0 of") != std::string::npos);
  CHECK(m.find("checksum mismatch") != std::string::npos);
}

TEST_CASE("a full NVMe device mid-step fails the step and keeps the last good parameters and state",
          "[offload][uring][negative]") {
  test::TempDir dir("strata-offload");
  auto c = stage3_config(1);
  place(c, OffloadDevice::nvme, OffloadDevice::nvme, dir.path());
  c.aio.block_size = 4096;
  test::MlpRank t(c);
  (void)t.mlp->train_step(0);
  (void)t.mlp->train_step(1);
  const auto good = t.engine->full_parameters();
  std::string m;
  {
    test::FileSizeLimit limit(8192);  // swap data starts past the header and checksum table
    m = step_error(t, 2);
  }
  INFO(m);
  CHECK(m.find("EFBIG") != std::string::npos);
  CHECK(m.find("on the NVMe tier") != std::string::npos);
  const auto after = t.engine->full_parameters();
  REQUIRE(after.size() == good.size());
  CHECK(std::memcmp(after.data(), good.data(), good.size() * 4) == 0);
}

TEST_CASE(
    "a host budget below one parameter buffer is refused before setup allocates, naming the minimum, which trains",
    "[offload][uring][negative]") {
  test::TempDir dir("strata-offload");
  test::TrainSpec spec;
  spec.steps = 1;
  spec.config = stage3_config(1);
  place(spec.config, OffloadDevice::cpu, OffloadDevice::nvme, dir.path());  // static: both kinds named
  spec.config.offload_param.buffer_size = 100000;  // 200000 B -> one layer's 2112 B rounded to 4 KiB
  spec.config.memory_budget.host = 6000;           // scratch and gradient staging (3000 B) leave 3000 B
  const std::string m = train_error(spec);
  INFO(m);
  CHECK(m.find("host tier: raise memory_budget.host to at least ") != std::string::npos);
  CHECK(m.find("4.00 KiB for one NVMe swap buffer per store") != std::string::npos);
  const std::string key = "raise memory_budget.host to at least ";
  const auto at = m.find(key);
  REQUIRE(at != std::string::npos);
  spec.config.memory_budget.host = std::stoull(m.substr(at + key.size()));
  CHECK(train_error(spec).empty());
}

TEST_CASE("a memory_budget nothing fits is refused before training, naming the smallest budget that would",
          "[offload][negative]") {
  test::TrainSpec spec;
  spec.steps = 1;
  spec.config = stage3_config(1);
  spec.device_budget = 4 << 10;  // below the live window (2 x 2112 B)
  spec.config.memory_budget.device = 4 << 10;
  spec.config.memory_budget.host = 1 << 20;
  const std::string m = train_error(spec);
  INFO(m);
  CHECK(m.find("memory_budget.device = 4.00 KiB is too small") != std::string::npos);
  CHECK(m.find("Raise memory_budget.device to at least") != std::string::npos);
}

TEST_CASE("an offload_param.nvme_path that cannot hold swap files fails at setup, naming the key and the file",
          "[offload][uring][negative]") {
  test::TempDir dir("strata-offload");
  test::TrainSpec spec;
  spec.steps = 1;
  spec.config = stage3_config(1);
  SECTION("a directory that cannot be created") {
    place(spec.config, OffloadDevice::cpu, OffloadDevice::nvme, "/proc/strata-offload-test");
    const std::string m = train_error(spec);
    INFO(m);
    CHECK(m.find("offload_param.nvme_path") != std::string::npos);
    CHECK(m.find("/proc/strata-offload-test/rank0") != std::string::npos);  // the rank directory, locked first
  }
  SECTION("a device too full for the files") {
    place(spec.config, OffloadDevice::cpu, OffloadDevice::nvme, dir.path());
    std::string m;
    {
      test::FileSizeLimit limit(8192);  // room for a header and checksum table, none for data
      m = train_error(spec);
    }
    INFO(m);
    CHECK(m.find("parameter shard of layer 0") != std::string::npos);
    CHECK(m.find(dir.path() + "/rank0/params/layer_0.params.c0.a.swap") != std::string::npos);
    CHECK(m.find("EFBIG") != std::string::npos);
    std::error_code ec;
    CHECK(std::filesystem::is_empty(dir.path(), ec));  // nothing reserved is left behind
  }
}

TEST_CASE("a pinned budget below one swap buffer fails at setup, naming the minimum", "[offload][uring][negative]") {
  test::TempDir dir("strata-offload");
  test::TrainSpec spec;
  spec.steps = 1;
  spec.config = stage3_config(1);
  place(spec.config, OffloadDevice::nvme, OffloadDevice::none, dir.path());
  spec.config.offload_optimizer.pin_memory = true;  // the host tier is the device's pinned budget
  spec.config.zero.sub_group_size = 1000;           // one buffer: 1000 x 12 B -> 12288 B
  spec.pinned_budget = 14 << 10;                    // scratch and gradient staging (3000 B) leave 11336 B
  const std::string m = train_error(spec);
  INFO(m);
  CHECK(m.find("host tier") != std::string::npos);
  CHECK(m.find("pinned host memory") != std::string::npos);
  CHECK(m.find("at least 12.00 KiB (12288 B)") != std::string::npos);
  CHECK(m.find("pinned budget") != std::string::npos);
}

TEST_CASE("a parameter write-back that fails is reported, and its staging is not leaked",
          "[offload][uring][negative]") {
  test::TempDir dir("strata-offload");
  auto c = stage3_config(1);
  place(c, OffloadDevice::cpu, OffloadDevice::nvme, dir.path());
  c.aio.block_size = 4096;
  test::MlpRank t(c);
  (void)t.mlp->train_step(0);
  t.engine->synchronize();
  const auto buffers = static_cast<int>(engine::Kind::buffers);
  const auto before = t.engine->memory().host.kind_used[buffers];
  std::string m;
  {
    test::FileSizeLimit limit(8192);  // every write-back of step 2 fails (or is skipped after the first)
    (void)t.mlp->train_step(1);       // write-backs run behind the step
    m = test::error_of([&] { t.engine->synchronize(); });
  }
  INFO(m);
  CHECK(m.find("EFBIG") != std::string::npos);
  CHECK(m.find("parameter shard of layer") != std::string::npos);
  CHECK(t.engine->memory().host.kind_used[buffers] == before);
}
