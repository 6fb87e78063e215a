// Checkpoints across world sizes and stages: saved at world 2, stage 3 (optimizer state on
// NVMe, parameter shards in host RAM), loaded at world 1 stage 1, at world 4 stage 2 and
// back at world 2 stage 3: every tensor's master weights and both moments, re-saved from
// the loaded engines, equal the source byte for byte; training continues from the saved
// step counter. A checkpoint of another model is refused by name.
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>

#include "checkpoint/directory.h"
#include "checkpoint/shard_file.h"
#include "runtime/core/error.h"
#include "runtime/device/device.h"
#include "tests/engine/engine_support.h"
#include "tests/engine/stack_trainer.h"
#include "tests/support/error_of.h"
#include "tests/support/file_size_limit.h"
#include "tests/support/temp_dir.h"

namespace strata::test {
namespace {

using checkpoint::State;

TrainSpec spec_for(int stage, int world) {
  TrainSpec s;
  s.config = mlp_config(stage, world, DType::bf16);
  s.world = world;
  s.layers = 3;
  s.hidden = 40;  // 1640 elements per layer: buckets of 300 cut parameters and pad
  return s;
}

TEST_CASE("a checkpoint reshards across world sizes and stages with every state byte-exact", "[checkpoint]") {
  TempDir dir("engine-ckpt");
  TrainSpec src = spec_for(3, 2);
  src.steps = 3;
  src.config.offload_optimizer.device = engine::OffloadDevice::nvme;
  src.config.offload_optimizer.nvme_path = dir.file("nvme");
  src.config.offload_param.device = engine::OffloadDevice::cpu;
  src.save_checkpoint = dir.file("w2s3");
  const TrainRun a = train_mlp(src);
  const auto saved = checkpoint_contents(src.save_checkpoint);
  REQUIRE(saved.size() == 6 * 3);

  struct Hop {
    int stage, world;
    std::string from, to;
  };
  for (const Hop& h :
       {Hop{1, 1, "w2s3", "w1s1"}, Hop{2, 4, "w2s3", "w4s2"}, Hop{3, 2, "w4s2", "back"}, Hop{0, 2, "w1s1", "w2s0"}}) {
    INFO("world " << h.world << " stage " << h.stage << " from " << h.from);
    TrainSpec t = spec_for(h.stage, h.world);
    t.steps = 0;
    t.load_checkpoint = dir.file(h.from);
    t.save_checkpoint = dir.file(h.to);
    const TrainRun b = train_mlp(t);
    CHECK(b.params == a.params);  // the fp32 masters, gathered
    CHECK(checkpoint_contents(t.save_checkpoint) == saved);
    CHECK(checkpoint::open_checkpoint(t.save_checkpoint).manifest.world_size == h.world);
  }

  // Training continues at world 4 stage 2: the step counter goes on from 3.
  TrainSpec more = spec_for(2, 4);
  more.steps = 2;
  more.load_checkpoint = dir.file("w2s3");
  const TrainRun c = train_mlp(more);
  CHECK(c.step_numbers == std::vector<std::int64_t>{4, 5});
  for (double l : c.losses) CHECK(std::isfinite(l));
  CHECK(c.params != a.params);
}

// One rank's engine on a 64 MiB host device with the MLP (3 layers) registered and set up.
struct OneRank {
  OneRank(const engine::EngineConfig& config, int hidden)
      : dev(device::Device::create(device_options())), engine(options(config)), mlp(engine, {3, hidden, 0, 7}) {
    engine.setup();
  }
  static device::DeviceOptions device_options() {
    device::DeviceOptions d;
    d.budget_bytes = std::uint64_t{64} << 20;
    return d;
  }
  engine::EngineOptions options(const engine::EngineConfig& config) {
    engine::EngineOptions eo;
    eo.config = config;
    eo.device = dev.get();
    return eo;
  }
  std::unique_ptr<device::Device> dev;
  engine::Engine engine;
  test::StackTrainer mlp;
};

TEST_CASE("NVMe optimizer state is linked into a checkpoint and stays as saved while training goes on",
          "[checkpoint]") {
  TempDir dir("engine-ckpt");
  auto config = mlp_config(2, 1, DType::bf16);
  config.offload_optimizer.device = engine::OffloadDevice::nvme;
  config.offload_optimizer.nvme_path = dir.file("nvme");
  config.zero.sub_group_size = 1000;  // several swap files per layer
  OneRank one(config, 40);
  auto& engine = one.engine;
  auto& mlp = one.mlp;
  for (int s = 0; s < 2; ++s) mlp.train_step(s);
  const auto linked = engine.save_checkpoint(dir.file("linked"));
  engine::SaveOptions copy;
  copy.link_nvme = false;
  const auto copied = engine.save_checkpoint(dir.file("copied"), "{}", copy);
  CHECK(linked.nvme_linked_bytes > 0);
  CHECK(linked.nvme_copied_bytes == 0);
  CHECK(copied.nvme_linked_bytes == 0);
  CHECK(copied.bytes > linked.bytes);  // the state went through host memory into the shard file
  const auto saved = checkpoint_contents(dir.file("copied"));
  CHECK(checkpoint_contents(dir.file("linked")) == saved);
  int swap_files = 0;
  for (const auto& f : checkpoint::open_checkpoint(dir.file("linked")).manifest.files)
    swap_files += f.kind == checkpoint::FileKind::swap;
  CHECK(swap_files >= 6);
  // Both swap-file generations are rewritten: the linked ones get new inodes first.
  for (int s = 2; s < 5; ++s) mlp.train_step(s);
  CHECK(checkpoint_contents(dir.file("linked")) == saved);
  const auto o = checkpoint::open_checkpoint(dir.file("linked"));
  checkpoint::ShardReader(o.dir, o.manifest).verify_all();
  CHECK(checkpoint_contents(engine.save_checkpoint(dir.file("later")).dir) != saved);
}

TEST_CASE("an asynchronous save that fails is reported, training goes on and latest stays", "[checkpoint]") {
  TempDir dir("engine-ckpt");
  auto config = mlp_config(1, 1, DType::bf16);
  config.offload_optimizer.device = engine::OffloadDevice::cpu;
  OneRank one(config, 128);
  auto& engine = one.engine;
  auto& mlp = one.mlp;
  mlp.train_step(0);
  const auto good = engine.save_checkpoint(dir.file("ck"));
  engine::SaveOptions async;
  async.async = true;
  const auto host_before = engine.memory().host.used_bytes;
  {
    FileSizeLimit limit(64 * 1024);  // the shard file (600 KiB) does not fit
    const auto r = engine.save_checkpoint(dir.file("ck"), "{}", async);
    CHECK(r.async);
    CHECK_FALSE(r.committed);
    engine.wait_checkpoint();
  }
  const auto done = engine.finished_checkpoints();
  REQUIRE(done.size() == 1);
  CHECK_FALSE(done[0].committed);
  CHECK_THAT(done[0].error, Catch::Contains("rank00000.bin': writing") && Catch::Contains("a full disk?"));
  CHECK(checkpoint::open_checkpoint(dir.file("ck")).dir == good.dir);
  CHECK(checkpoint::list_checkpoints(dir.file("ck")) == std::vector<std::int64_t>{1});
  CHECK(engine.memory().host.used_bytes == host_before);  // the staging went back
  // Training goes on, and the next asynchronous save commits at a step's end.
  const auto next = engine.save_checkpoint(dir.file("ck"), "{}", async);
  for (int s = 1; s < 40 && engine.finished_checkpoints().empty(); ++s) mlp.train_step(s);
  CHECK(checkpoint::open_checkpoint(dir.file("ck")).dir == next.dir);
  CHECK_FALSE(std::filesystem::exists(checkpoint::staging_dir(dir.file("ck"), next.step)));
}

TEST_CASE("an asynchronous save whose staging does not fit the host budget saves synchronously", "[checkpoint]") {
  TempDir dir("engine-ckpt");
  TrainSpec t = spec_for(1, 2);
  t.hidden = 256;  // 2.4 MB of state: each rank stages 1.2 MB
  t.steps = 1;
  t.config.memory_budget.host = 1 << 20;
  t.save_checkpoint = dir.file("ck");
  t.async_save = true;
  const TrainRun r = train_mlp(t);
  REQUIRE(r.saved.size() == 1);
  CHECK_FALSE(r.saved[0].async);
  CHECK(r.saved[0].committed);
  CHECK(checkpoint::open_checkpoint(dir.file("ck")).manifest.step == 1);
}

TEST_CASE("loading a checkpoint of another model names the tensor", "[checkpoint]") {
  TempDir dir("engine-ckpt");
  TrainSpec src = spec_for(1, 1);
  src.steps = 1;
  src.save_checkpoint = dir.file("a");
  train_mlp(src);
  TrainSpec other = spec_for(1, 1);
  other.steps = 0;
  other.layers = 4;
  other.load_checkpoint = dir.file("a");
  CHECK_THAT(error_of([&] { train_mlp(other); }), Catch::Contains("has no tensor 'layers.3.weight'"));
  other.layers = 2;
  CHECK_THAT(error_of([&] { train_mlp(other); }),
             Catch::Contains("has tensor 'layers.2.weight', which this model does not register"));
}

}  // namespace
}  // namespace strata::test
