// The ZeRO engine with offload_optimizer.device = nvme: bitwise-identical parameters after 10
// steps whether the optimizer state lives on the device, in host RAM or on NVMe (stages 1-3,
// world sizes 1 and 2, sub-groups cut across buckets), and the setup-time refusals.
#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>

#include "runtime/core/error.h"
#include "tests/engine/engine_support.h"
#include "tests/support/error_of.h"
#include "tests/support/file_size_limit.h"
#include "tests/support/temp_dir.h"

using namespace strata;

namespace {

std::string train_error(const test::TrainSpec& spec) {
  return test::error_of([&] { (void)test::train_mlp(spec); });
}

// The minimum a refusal names (after `key`, in bytes) is enough to train, and one byte less is
// refused again with `refusal`.
void named_minimum_trains(test::TrainSpec spec, const std::string& m, const std::string& key,
                          std::uint64_t engine::MemoryBudget::*budget, const std::string& refusal) {
  const auto at = m.find(key);
  REQUIRE(at != std::string::npos);
  spec.config.memory_budget.*budget = std::stoull(m.substr(at + key.size()));
  CHECK(train_error(spec).empty());
  spec.config.memory_budget.*budget -= 1;
  CHECK(train_error(spec).find(refusal) != std::string::npos);
}

}  // namespace

TEST_CASE("parameters are bitwise identical after 10 steps with optimizer state on device, host or NVMe",
          "[offload][uring]") {
  const int world = GENERATE(1, 2);
  const int stage = GENERATE(1, 2, 3);
  INFO("world " << world << " stage " << stage);
  test::TempDir dir("strata-offload");
  test::TrainSpec spec;
  spec.world = world;
  spec.steps = 10;
  spec.config = test::mlp_config(stage, world, DType::bf16);
  spec.config.zero.sub_group_size = 100;  // buckets are 300 elements: sub-groups cut across them
  const auto on_device = test::train_mlp(spec);
  spec.config.offload_optimizer.device = engine::OffloadDevice::cpu;
  const auto on_host = test::train_mlp(spec);
  spec.config.offload_optimizer.device = engine::OffloadDevice::nvme;
  spec.config.offload_optimizer.nvme_path = dir.path();
  spec.config.offload_optimizer.buffer_count = 3;
  const auto on_nvme = test::train_mlp(spec);
  REQUIRE(on_nvme.params.size() == on_device.params.size());
  CHECK(std::memcmp(on_device.params.data(), on_host.params.data(), on_host.params.size() * 4) == 0);
  CHECK(std::memcmp(on_device.params.data(), on_nvme.params.data(), on_nvme.params.size() * 4) == 0);
  CHECK(on_nvme.losses == on_device.losses);
  CHECK(on_nvme.losses.back() < on_nvme.losses.front());
  // No copy of the state outside the swap buffers: 3 buffers of 100 x 12 B (4 KiB each).
  const auto opt = static_cast<int>(engine::Kind::optimizer), buf = static_cast<int>(engine::Kind::buffers);
  CHECK(on_nvme.memory.device.kind_used[opt] == 0);
  CHECK(on_nvme.memory.host.kind_used[opt] == 0);
  CHECK(on_nvme.memory.host.kind_used[buf] - on_host.memory.host.kind_used[buf] == 3 * 4096);
}

// One rank, one micro-batch: accumulators in host RAM hold the compute dtype (half the
// bytes) and the parameters are still those of fp32 accumulators on the device.
TEST_CASE("one gradient per step in compute-dtype host accumulators changes no bit", "[offload][uring]") {
  const auto cdt = GENERATE(DType::bf16, DType::fp16);
  const int stage = GENERATE(1, 3);
  INFO(dtype_name(cdt) << " stage " << stage);
  test::TempDir dir("strata-offload");
  test::TrainSpec spec;
  spec.steps = 8;
  spec.config = test::mlp_config(stage, 1, cdt, /*micro=*/8, /*accum=*/1);
  spec.config.zero.sub_group_size = 100;
  const auto on_device = test::train_mlp(spec);
  spec.config.offload_optimizer.device = engine::OffloadDevice::cpu;
  const auto on_host = test::train_mlp(spec);
  spec.config.offload_optimizer.device = engine::OffloadDevice::nvme;
  spec.config.offload_optimizer.nvme_path = dir.path();
  const auto on_nvme = test::train_mlp(spec);
  REQUIRE(on_nvme.params.size() == on_device.params.size());
  CHECK(std::memcmp(on_device.params.data(), on_host.params.data(), on_host.params.size() * 4) == 0);
  CHECK(std::memcmp(on_device.params.data(), on_nvme.params.data(), on_nvme.params.size() * 4) == 0);
  CHECK(on_nvme.losses == on_device.losses);
  const auto grads = static_cast<int>(engine::Kind::grads);
  CHECK(on_device.memory.host.kind_used[grads] == 0);
  CHECK(on_host.memory.host.kind_used[grads] * 2 == on_device.memory.device.kind_used[grads]);
  CHECK(on_nvme.memory.host.kind_used[grads] == on_host.memory.host.kind_used[grads]);
}

TEST_CASE("Lion and Adagrad give the same bits with their state on NVMe", "[offload][uring]") {
  const auto type = GENERATE(engine::OptimizerType::lion, engine::OptimizerType::adagrad);
  test::TempDir dir("strata-offload");
  test::TrainSpec spec;
  spec.world = 2;
  spec.config = test::mlp_config(2, 2, DType::bf16);
  spec.config.optimizer.type = type;
  spec.config.zero.sub_group_size = 128;
  const auto on_device = test::train_mlp(spec);
  spec.config.offload_optimizer.device = engine::OffloadDevice::nvme;
  spec.config.offload_optimizer.nvme_path = dir.path();
  const auto on_nvme = test::train_mlp(spec);
  REQUIRE(on_nvme.params.size() == on_device.params.size());
  CHECK(std::memcmp(on_device.params.data(), on_nvme.params.data(), on_nvme.params.size() * 4) == 0);
}

TEST_CASE("an nvme_path that cannot hold swap files fails at setup, naming the key", "[offload][uring][negative]") {
  test::TrainSpec spec;
  spec.steps = 1;
  spec.config = test::mlp_config(2, 1, DType::bf16);
  spec.config.offload_optimizer.device = engine::OffloadDevice::nvme;
  spec.config.offload_optimizer.nvme_path = "/proc/strata-offload-test";
  const std::string m = train_error(spec);
  INFO(m);
  CHECK(m.find("offload_optimizer.nvme_path") != std::string::npos);
  CHECK(m.find("/proc/strata-offload-test/rank0") != std::string::npos);
}

TEST_CASE("a host budget below one swap buffer is refused before setup allocates, naming the minimum, which trains",
          "[offload][uring][negative]") {
  test::TempDir dir("strata-offload");
  test::TrainSpec spec;
  spec.steps = 1;
  spec.config = test::mlp_config(1, 1, DType::bf16);
  spec.config.offload_optimizer.device = engine::OffloadDevice::nvme;
  spec.config.offload_optimizer.nvme_path = dir.path();
  spec.config.zero.sub_group_size = 1000;  // one buffer: 1000 x 12 B -> 12288 B
  spec.config.memory_budget.host = 8192;   // the reduction scratch takes part of it
  const std::string m = train_error(spec);
  INFO(m);
  CHECK(m.find("host tier: raise memory_budget.host to at least ") != std::string::npos);
  CHECK(m.find("12.00 KiB for one NVMe swap buffer per store") != std::string::npos);
  CHECK(m.find(". Why: the placement needs") < 200);  // the fix first, in under 200 characters
  // The minimum it names is enough: setup sizes the swap buffers to what the budget leaves.
  named_minimum_trains(spec, m, "raise memory_budget.host to at least ", &engine::MemoryBudget::host,
                       "host tier: raise memory_budget.host to at least");
}

TEST_CASE("an NVMe budget below the swap files is refused before any is created, naming the minimum, which trains",
          "[offload][uring][negative]") {
  test::TempDir dir("strata-offload");
  test::TrainSpec spec;
  spec.steps = 1;
  spec.config = test::mlp_config(2, 1, DType::bf16);
  spec.config.offload_optimizer.device = engine::OffloadDevice::nvme;
  spec.config.offload_optimizer.nvme_path = dir.path();
  spec.config.memory_budget.nvme = 4096;
  const std::string m = train_error(spec);
  INFO(m);
  CHECK(m.find("NVMe tier: this placement's swap files need ") != std::string::npos);
  CHECK(m.find("but memory_budget.nvme is 4.00 KiB") != std::string::npos);
  std::error_code ec;
  CHECK(std::filesystem::is_empty(dir.path(), ec));  // refused before any file was made
  named_minimum_trains(spec, m, "Raise memory_budget.nvme to at least ", &engine::MemoryBudget::nvme,
                       "NVMe tier: this placement's swap files need");
}

TEST_CASE("a device too full for the swap files fails at setup, naming the layer and the file",
          "[offload][uring][negative]") {
  test::TempDir dir("strata-offload");
  test::TrainSpec spec;
  spec.steps = 1;
  spec.config = test::mlp_config(3, 1, DType::bf16);
  spec.config.offload_optimizer.device = engine::OffloadDevice::nvme;
  spec.config.offload_optimizer.nvme_path = dir.path();
  spec.config.zero.sub_group_size = 100;
  std::string m;
  {
    test::FileSizeLimit limit(8192);  // room for a header and checksum table, none for data
    m = train_error(spec);
  }
  INFO(m);
  CHECK(m.find("optimizer state of layer 0") != std::string::npos);
  CHECK(m.find(dir.path() + "/rank0/layer_0.sg0.a.swap") != std::string::npos);
  CHECK(m.find("EFBIG") != std::string::npos);
  std::error_code ec;
  CHECK(std::filesystem::is_empty(dir.path(), ec));  // nothing reserved is left behind
}
