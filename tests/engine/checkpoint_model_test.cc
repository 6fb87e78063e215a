// Committed checkpoints are immutable: a model-based randomized test. Seeded sequences of
// steps, saves (synchronous or asynchronous, NVMe state linked or copied, two save roots,
// retention on one), loads of any committed checkpoint, restarts (the engine destroyed and
// a new one resumed from `latest`, its swap directory cleaned as after a crash) and reads
// (what export does) run against one engine with every piece of state on NVMe (the third
// seed with q8 moments, whose swap files are linked too, lanes into their blocks). The model
// records each checkpoint's exact file bytes when it commits; after every operation each
// recorded checkpoint must verify and hold exactly those bytes, unless retention removed it
// (only ever the oldest) or a later save of the same step replaced it. A load must also
// give back exactly the loaded state: the next save without a step in between holds the
// loaded checkpoint's tensors.
#include <catch2/catch.hpp>
#include <filesystem>
#include <map>
#include <random>

#include "checkpoint/directory.h"
#include "checkpoint/shard_file.h"
#include "engine/engine.h"
#include "runtime/device/device.h"
#include "tests/engine/checkpoint_files.h"
#include "tests/engine/engine_support.h"
#include "tests/engine/stack_trainer.h"
#include "tests/support/temp_dir.h"

namespace strata::test {
namespace {

namespace fs = std::filesystem;

struct Model {
  // root -> step -> the checkpoint's files as committed
  std::map<std::string, std::map<std::int64_t, std::map<std::string, std::string>>> committed;
  std::map<std::string, int> keep;
  int checks = 0;

  void record(const std::string& root, std::int64_t step) {
    committed[root][step] = checkpoint_files(root + "/" + checkpoint::step_dir_name(step));
  }
  // Every recorded checkpoint is there with its bytes, or was the oldest under a root with
  // retention; every one there verifies.
  void check() {
    for (auto& [root, steps] : committed) {
      const auto present = checkpoint::list_checkpoints(root);
      for (auto it = steps.begin(); it != steps.end();) {
        const std::string dir = root + "/" + checkpoint::step_dir_name(it->first);
        if (!fs::exists(dir)) {
          INFO("checkpoint " << dir << " is gone");
          REQUIRE(keep[root] > 0);
          REQUIRE(present.size() >= static_cast<std::size_t>(keep[root]));
          REQUIRE(it->first < present[present.size() - static_cast<std::size_t>(keep[root])]);
          it = steps.erase(it);
          continue;
        }
        INFO("checkpoint " << dir);
        REQUIRE(checkpoint_files(dir) == it->second);
        const auto o = checkpoint::open_checkpoint(dir);
        checkpoint::ShardReader(o.dir, o.manifest).verify_all();
        ++checks;
        ++it;
      }
    }
  }
};

// The engine under test, and the step its next train_step() takes.
struct Run : MlpRank {
  explicit Run(const engine::EngineConfig& c) : MlpRank(c, 48) {}
  std::int64_t next_step = 0;
};

TEST_CASE("no sequence of saves, loads, steps, restarts and reads changes a committed checkpoint",
          "[offload][uring][checkpoint][stress]") {
  const unsigned seed = GENERATE(1u, 2u, 3u);
  INFO("seed " << seed);
  TempDir dir("ckpt-model");
  auto c = mlp_config(3, 1, DType::bf16);
  if (seed == 3) c.optimizer.moment_format = MomentFormat::q8;
  c.offload_optimizer.device = engine::OffloadDevice::nvme;
  c.offload_optimizer.nvme_path = dir.file("nvme");
  c.offload_param.device = engine::OffloadDevice::nvme;
  c.offload_param.nvme_path = dir.file("nvme");
  c.offload_param.buffer_count = 4;
  c.offload_param.buffer_size = 4096;
  c.zero.sub_group_size = 2000;
  c.zero.stage3_param_persistence_threshold = 0;
  const std::string roots[2] = {dir.file("a"), dir.file("nvme/rank0/b")};  // b inside the swap directory
  Model model;
  model.keep[roots[0]] = 0;
  model.keep[roots[1]] = 2;
  auto run = std::make_unique<Run>(c);
  std::mt19937 rng(seed);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  std::map<std::string, std::vector<char>> loaded;  // state loaded and not stepped since
  std::string last_saved;
  int ops[6] = {};
  auto take_finished = [&] {
    for (const auto& r : run->engine->finished_checkpoints()) {
      REQUIRE(r.committed);
      model.record(fs::path(r.dir).parent_path().string(), r.step);
    }
  };
  for (int op = 0; op < 60; ++op) {
    // A load right after a save is the sequence that once damaged the saved checkpoint.
    const int kind = !last_saved.empty() && pick(2) == 0 ? 7 : pick(10);
    if (kind < 4) {  // a training step
      run->mlp->train_step(run->next_step++);
      loaded.clear();
      last_saved.clear();
      ++ops[0];
    } else if (kind < 7) {  // a save
      const int r = pick(2);
      engine::SaveOptions o;
      o.keep = model.keep[roots[r]];
      o.link_nvme = pick(4) != 0;
      o.async = pick(3) == 0;
      const auto saved = run->engine->save_checkpoint(roots[r], "{}", o);
      last_saved = saved.dir;
      if (saved.committed) {
        model.record(roots[r], saved.step);
        if (!loaded.empty()) CHECK(checkpoint_contents(saved.dir) == loaded);
      }
      ++ops[o.async ? 2 : 1];
    } else if (kind < 9) {  // a load of any committed checkpoint
      run->engine->wait_checkpoint();
      take_finished();
      std::vector<std::string> all;
      for (const auto& [root, steps] : model.committed)
        for (const auto& [step, files] : steps) all.push_back(root + "/" + checkpoint::step_dir_name(step));
      // Another checkpoint than the last saved where there is one: loading the state the
      // engine holds writes the same bytes and would hide a write into a linked file.
      std::erase(all, last_saved);
      if (all.empty()) continue;
      const std::string from = all[static_cast<std::size_t>(pick(static_cast<int>(all.size())))];
      run->engine->load_checkpoint(from);
      loaded = checkpoint_contents(from);
      run->next_step = checkpoint::open_checkpoint(from).manifest.step;
      ++ops[3];
    } else if (pick(2) == 0) {  // a restart from latest (as --resume latest)
      run->engine->wait_checkpoint();
      take_finished();
      const std::string root = roots[pick(2)];
      if (checkpoint::list_checkpoints(root).empty()) continue;
      run.reset();  // the swap directory's lock goes; the next run cleans up its leftovers
      run = std::make_unique<Run>(c);
      const auto opened = checkpoint::open_checkpoint(root);
      run->engine->load_checkpoint(root);
      loaded = checkpoint_contents(opened.dir);
      run->next_step = opened.manifest.step;
      ++ops[4];
    } else {  // a read of every tensor (strata export reads a checkpoint this way)
      for (const auto& [root, steps] : model.committed)
        for (const auto& [step, files] : steps) checkpoint_contents(root + "/" + checkpoint::step_dir_name(step));
      ++ops[5];
    }
    take_finished();
    model.check();
  }
  run->engine->wait_checkpoint();
  take_finished();
  model.check();
  std::printf("seed %u: %d steps, %d saves, %d async saves, %d loads, %d restarts, %d reads; %d checkpoint checks\n",
              seed, ops[0], ops[1], ops[2], ops[3], ops[4], ops[5], model.checks);
  CHECK(ops[3] + ops[4] > 0);
}

}  // namespace
}  // namespace strata::test
