// An asynchronous checkpoint while training goes on, with every piece of state on NVMe
// (stage 3, optimizer state and parameter shards): the writer thread runs beside the steps
// that rewrite both swap-file generations, including the ones the checkpoint linked, and the
// save commits at a step's end with exactly the state a synchronous save took at the same
// point. Part of the offload suite, so ThreadSanitizer runs it too.
#include <catch2/catch.hpp>

#include "checkpoint/directory.h"
#include "checkpoint/shard_file.h"
#include "engine/engine.h"
#include "runtime/device/device.h"
#include "tests/engine/engine_support.h"
#include "tests/engine/stack_trainer.h"
#include "tests/support/temp_dir.h"

namespace strata::test {
namespace {

TEST_CASE("an asynchronous checkpoint of NVMe state commits while training rewrites the swap files",
          "[offload][uring][checkpoint]") {
  TempDir dir("offload-ckpt");
  device::DeviceOptions d;
  d.budget_bytes = std::uint64_t{64} << 20;
  auto dev = device::Device::create(d);
  engine::EngineOptions eo;
  eo.config = mlp_config(3, 1, DType::bf16);
  eo.config.offload_optimizer.device = engine::OffloadDevice::nvme;
  eo.config.offload_optimizer.nvme_path = dir.file("nvme");
  eo.config.offload_param.device = engine::OffloadDevice::nvme;
  eo.config.offload_param.nvme_path = dir.file("nvme");
  eo.config.offload_param.buffer_count = 4;
  eo.config.offload_param.buffer_size = 4096;
  eo.config.zero.sub_group_size = 1000;
  eo.config.zero.stage3_param_persistence_threshold = 0;
  eo.device = dev.get();
  engine::Engine engine(eo);
  test::StackTrainer mlp(engine, {3, 64, 0, 7});
  engine.setup();
  for (int s = 0; s < 2; ++s) mlp.train_step(s);
  engine::SaveOptions copy;
  copy.link_nvme = false;
  engine.save_checkpoint(dir.file("sync"), "{}", copy);
  engine::SaveOptions async;
  async.async = true;
  const auto started = engine.save_checkpoint(dir.file("async"), "{}", async);
  CHECK(started.async);
  CHECK_FALSE(started.committed);
  std::vector<engine::SaveResult> done;
  for (int s = 2; s < 6; ++s) {
    mlp.train_step(s);
    for (auto& r : engine.finished_checkpoints()) done.push_back(r);
  }
  engine.wait_checkpoint();
  for (auto& r : engine.finished_checkpoints()) done.push_back(r);
  REQUIRE(done.size() == 1);
  CHECK(done[0].committed);
  CHECK(done[0].nvme_linked_bytes > 0);
  CHECK(checkpoint_contents(dir.file("async")) == checkpoint_contents(dir.file("sync")));
  const auto o = checkpoint::open_checkpoint(dir.file("async"));
  checkpoint::ShardReader(o.dir, o.manifest).verify_all();
}

}  // namespace
}  // namespace strata::test
