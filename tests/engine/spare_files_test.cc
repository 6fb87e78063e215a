// Optimizer state on NVMe with fewer spare files than sub-groups
// (offload_optimizer.spare_sub_groups), and stage-3 parameter shards with fewer than chunks
// (offload_param.spare_chunks): the bits of two generations at stages 2 and 3 on one and two
// ranks; NVMe files of the state plus the spares (so a budget only that fits trains, where two
// generations are refused, and budget-driven placement reserves the spares it makes); and a
// step that fails after it began to commit: the engine refuses to go on, naming why and what
// to do, until a checkpoint is loaded, after which training gives the bits of a run that never
// failed.
#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "checkpoint/directory.h"
#include "engine/engine.h"
#include "offload/ledger.h"
#include "runtime/core/error.h"
#include "runtime/core/units.h"
#include "tests/engine/engine_support.h"
#include "tests/engine/stack_trainer.h"
#include "tests/support/error_of.h"
#include "tests/support/temp_dir.h"

using namespace strata;
using engine::OffloadDevice;

namespace {

constexpr auto kOptimizer = static_cast<std::size_t>(offload::Kind::optimizer);
constexpr auto kParams = static_cast<std::size_t>(offload::Kind::params);

void on_nvme(engine::EngineConfig& c, const std::string& dir, OffloadDevice params, std::uint64_t spares) {
  c.zero.sub_group_size = 100;  // many sub-groups of one length, a few shorter ones
  c.zero.stage3_param_persistence_threshold = 0;
  c.offload_optimizer.device = OffloadDevice::nvme;
  c.offload_optimizer.nvme_path = dir;
  c.offload_optimizer.spare_sub_groups = spares;
  c.offload_param.spare_chunks = spares;
  c.offload_param.device = params;
  c.offload_param.nvme_path = dir;
  c.offload_param.buffer_size = 200;
}

// Flips a byte in the swap file that holds the last tensor's optimizer state now (files rotate
// between sub-groups of a length), found through a save into `links` that hard-links it.
void damage_last_state(engine::Engine& e, const std::string& links_dir, const std::string& swap_dir) {
  e.save_checkpoint(links_dir, "{}");
  const auto links = checkpoint::open_checkpoint(links_dir);
  const auto& last = links.manifest.tensors.back().states[0].back();
  const std::string linked = links.dir + "/" + links.manifest.files[static_cast<std::size_t>(last.file)].name;
  std::string damaged;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(swap_dir))
    if (std::filesystem::equivalent(entry.path(), linked)) damaged = entry.path().string();
  REQUIRE_FALSE(damaged.empty());
  std::fstream f(damaged, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(8192 + 5);  // the first payload block (4 KiB header, 4 KiB checksum table)
  f.put('\x5a');
}

}  // namespace

TEST_CASE("spare sub-groups: two generations' bits from the state plus its spares on NVMe", "[offload][uring]") {
  const int world = GENERATE(1, 2);
  const int stage = GENERATE(2, 3);
  const auto params = stage == 3 ? GENERATE(OffloadDevice::none, OffloadDevice::nvme) : OffloadDevice::none;
  INFO("world " << world << " stage " << stage << " parameters offloaded to " << static_cast<int>(params));
  test::TempDir dir("strata-spares");
  test::TrainSpec spec;
  spec.world = world;
  spec.steps = 5;
  spec.config = test::mlp_config(stage, world, DType::bf16);
  on_nvme(spec.config, dir.file("two"), params, 0);
  const test::TrainRun two = test::train_mlp(spec);
  on_nvme(spec.config, dir.file("spare"), params, 1);
  const test::TrainRun spare = test::train_mlp(spec);
  REQUIRE(spare.params.size() == two.params.size());
  CHECK(std::memcmp(spare.params.data(), two.params.data(), two.params.size() * 4) == 0);
  CHECK(spare.losses == two.losses);
  // Two generations hold the state twice; one spare per length adds a sub-group or two to once.
  const std::uint64_t twice = two.memory.nvme.kind_peak[kOptimizer], once = twice / 2;
  const std::uint64_t files = spare.memory.nvme.kind_peak[kOptimizer];
  INFO("NVMe optimizer files: " << twice << " B with two generations, " << files << " B with spares");
  CHECK(files > once);
  CHECK(files < once + once / 3);
  CHECK(spare.io.back().nvme_write_bytes == two.io.back().nvme_write_bytes);
  if (params == OffloadDevice::nvme) {  // the shards' files likewise (offload_param.spare_chunks 1)
    const std::uint64_t p_twice = two.memory.nvme.kind_peak[kParams], p_files = spare.memory.nvme.kind_peak[kParams];
    INFO("NVMe parameter files: " << p_twice << " B with two generations, " << p_files << " B with spares");
    CHECK(p_files > p_twice / 2);  // a layer's shard is one 4 KiB chunk here: three, and one spare
    CHECK(p_files <= p_twice / 2 + p_twice / 6);
  }
}

TEST_CASE("spare files: an NVMe budget only the state plus its spares fit trains; two generations are refused",
          "[offload][uring][negative]") {
  test::TempDir dir("strata-spares");
  test::TrainSpec spec;
  spec.steps = 2;
  spec.config = test::mlp_config(2, 1, DType::bf16);
  on_nvme(spec.config, dir.file("a"), OffloadDevice::none, 1);
  const std::uint64_t files = test::train_mlp(spec).memory.nvme.kind_peak[kOptimizer];
  spec.config.memory_budget.nvme = files;
  CHECK(test::error_of([&] { (void)test::train_mlp(spec); }).empty());
  spec.config.offload_optimizer.spare_sub_groups = 0;
  spec.config.offload_optimizer.nvme_path = dir.file("b");
  const std::string m = test::error_of([&] { (void)test::train_mlp(spec); });
  INFO(m);
  CHECK(m.find("NVMe tier: this placement's swap files need ") != std::string::npos);
  CHECK(m.find("offload_optimizer.spare_sub_groups") != std::string::npos);  // the way out it names
  CHECK(m.find("offload_param.spare_chunks") == std::string::npos);          // no parameters on NVMe

  // Stage 3 with the shards on NVMe too: their spares fit where their two generations do not.
  spec.config = test::mlp_config(3, 1, DType::bf16);
  on_nvme(spec.config, dir.file("c"), OffloadDevice::nvme, 1);
  const auto run = test::train_mlp(spec);
  spec.config.memory_budget.nvme = run.memory.nvme.kind_peak[kOptimizer] + run.memory.nvme.kind_peak[kParams];
  on_nvme(spec.config, dir.file("d"), OffloadDevice::nvme, 1);
  CHECK(test::error_of([&] { (void)test::train_mlp(spec); }).empty());
  spec.config.offload_param.spare_chunks = 0;
  spec.config.offload_param.nvme_path = dir.file("e");
  const std::string p = test::error_of([&] { (void)test::train_mlp(spec); });
  INFO(p);
  CHECK(p.find("of parameter files (in two generations") != std::string::npos);
  CHECK(p.find("offload_param.spare_chunks") != std::string::npos);
  CHECK(p.find("offload_optimizer.spare_sub_groups") == std::string::npos);  // already once plus spares
}

TEST_CASE("spare files: budget-driven placement reserves them on NVMe at the bytes the stores then create",
          "[offload][uring]") {
  test::TempDir dir("strata-spares");
  test::TrainSpec spec;
  spec.steps = 1;
  spec.config = test::mlp_config(3, 1, DType::bf16);
  // The optimizer state on NVMe, the shards where the budgets put them (the planner's choice).
  on_nvme(spec.config, dir.file("two"), OffloadDevice::none, 0);
  spec.config.memory_budget.nvme = std::uint64_t{1} << 30;
  const test::TrainRun two = test::train_mlp(spec);
  on_nvme(spec.config, dir.file("spare"), OffloadDevice::none, 1);
  const test::TrainRun spare = test::train_mlp(spec);
  INFO(spare.placement);
  CHECK(spare.placement.find("placement (budget-driven") != std::string::npos);
  // The spare files: what the store holds beyond its bytes once (half of two generations).
  std::uint64_t spares = 0;
  for (const std::size_t kind : {kOptimizer, kParams})
    spares += spare.memory.nvme.kind_peak[kind] - two.memory.nvme.kind_peak[kind] / 2;
  REQUIRE(spares > 0);
  CHECK(spare.placement.find(str_cat("(fixed: spare swap files ", format_bytes(spares), ")")) != std::string::npos);
  CHECK(two.placement.find("spare swap files") == std::string::npos);
  // A budget of the files it creates is one the planner accepts.
  spec.config.memory_budget.nvme = spare.memory.nvme.kind_peak[kOptimizer] + spare.memory.nvme.kind_peak[kParams];
  on_nvme(spec.config, dir.file("exact"), OffloadDevice::none, 1);
  CHECK(test::error_of([&] { (void)test::train_mlp(spec); }).empty());
}

TEST_CASE("spare sub-groups: a step that fails after it began to commit stops training until a checkpoint is loaded",
          "[offload][uring][negative]") {
  // With the shards on NVMe too (stage 3, one spare chunk), they cannot be rebuilt from masters
  // whose files mix two states: the gather refuses on the trainer's thread, and the load that
  // repairs the optimizer's files rewrites them as well.
  const auto params = GENERATE(OffloadDevice::none, OffloadDevice::nvme);
  INFO("parameters offloaded to " << static_cast<int>(params));
  test::TempDir dir("strata-spares");
  auto config = [&](const std::string& path) {
    auto c = test::mlp_config(params == OffloadDevice::nvme ? 3 : 2, 1, DType::bf16);
    on_nvme(c, path, params, 1);
    return c;
  };
  test::MlpRank ref(config(dir.file("ref"))), t(config(dir.file("run")));
  ref.train(0, 4);
  t.train(0, 2);
  engine::SaveOptions copy;
  copy.link_nvme = false;  // the damage below must not reach the checkpoint
  t.engine->save_checkpoint(dir.file("ckpt"), "{}", copy);
  // The last tensor's state is damaged: the next step reads it after the sub-groups before it
  // have used the one spare of their length and begun to commit.
  damage_last_state(*t.engine, dir.file("links"), dir.file("run"));
  const std::string failed = test::error_of([&] { (void)t.mlp->train_step(2); });
  INFO(failed);
  CHECK(failed.find("checksum mismatch") != std::string::npos);
  const std::string refused = test::error_of([&] { (void)t.mlp->train_step(2); });
  INFO(refused);
  CHECK(refused.find("mixes two states") != std::string::npos);
  CHECK(refused.find("resume from the last checkpoint") != std::string::npos);
  t.engine->abandon_step();  // a refused gather leaves the step open, as any failed forward does
  CHECK(test::error_of([&] { t.engine->save_checkpoint(dir.file("mixed"), "{}", copy); }).find("mixes two states") !=
        std::string::npos);
  t.engine->load_checkpoint(dir.file("ckpt"));
  t.train(2, 4);
  const auto got = t.engine->full_parameters(), want = ref.engine->full_parameters();
  REQUIRE(got.size() == want.size());
  CHECK(std::memcmp(got.data(), want.data(), got.size() * 4) == 0);
}

TEST_CASE("spare chunks: a step that fails after a shard began to commit rebuilds it, and a load recovers",
          "[offload][uring][negative]") {
  // Optimizer state in two generations (a failed step leaves its masters whole), shards with
  // one spare for the three layers' chunks of one length: layer 1's write commits layer 0's
  // early, then layer 2's state is found damaged. The roll-back rebuilds layer 0 from its
  // masters, so the next step fails on the damage again (not on layer 0's shard, and not on a
  // sticky failure that would also refuse the load), and a load then continues the run.
  test::TempDir dir("strata-spares");
  auto config = [&](const std::string& path) {
    auto c = test::mlp_config(3, 1, DType::bf16);
    on_nvme(c, path, OffloadDevice::nvme, 0);
    c.offload_param.spare_chunks = 1;
    return c;
  };
  test::MlpRank ref(config(dir.file("ref"))), t(config(dir.file("run")));
  ref.train(0, 4);
  t.train(0, 2);
  engine::SaveOptions copy;
  copy.link_nvme = false;
  t.engine->save_checkpoint(dir.file("ckpt"), "{}", copy);
  damage_last_state(*t.engine, dir.file("links"), dir.file("run"));
  for (int attempt = 0; attempt < 2; ++attempt) {
    const std::string failed = test::error_of([&] { (void)t.mlp->train_step(2); });
    INFO("attempt " << attempt << ": " << failed);
    CHECK(failed.find("checksum mismatch") != std::string::npos);
    CHECK(failed.find("mixes two states") == std::string::npos);
  }
  t.engine->load_checkpoint(dir.file("ckpt"));
  t.train(2, 4);
  const auto got = t.engine->full_parameters(), want = ref.engine->full_parameters();
  REQUIRE(got.size() == want.size());
  CHECK(std::memcmp(got.data(), want.data(), got.size() * 4) == 0);
}
