// Checkpoints of q8 optimizer moments (optimizer.moments "q8": 8-bit codes with a
// power-of-two scale per 16 elements): they store the q8 blocks as they are (the NVMe tier's
// swap files linked like any other's) and resume bitwise, a
// checkpoint of another format loads into a q8 run and a q8 one into an fp32 run, and a q8
// checkpoint moves between world sizes and stages with its values, tensors straddling
// blocks. (Training across stages and tiers, the bytes and offload_states:
// compact_state_test.cc.)
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "checkpoint/directory.h"
#include "engine/engine.h"
#include "tests/engine/engine_support.h"
#include "tests/engine/param_offload_support.h"
#include "tests/support/temp_dir.h"

using namespace strata;

namespace {

using engine::OffloadDevice;

test::TrainSpec q8_spec(int stage, OffloadDevice opt, OffloadDevice par, const std::string& dir) {
  test::TrainSpec spec;
  spec.world = 2;
  spec.steps = 6;
  spec.config = test::stage3_config(2);
  spec.config.zero.stage = stage;
  spec.config.zero.stage3_param_persistence_threshold = stage == 3 ? 1100 : 0;  // one layer persistent
  spec.config.optimizer.moment_format = MomentFormat::q8;
  test::place(spec.config, opt, par, dir);
  return spec;
}

}  // namespace

TEST_CASE("a checkpoint keeps q8 moments exactly, resumes bitwise and loads across formats",
          "[compact][q8][offload][uring]") {
  test::TempDir dir("strata-q8-ckpt");
  for (const OffloadDevice opt : {OffloadDevice::cpu, OffloadDevice::nvme}) {
    INFO("optimizer " << static_cast<int>(opt));
    const std::string at = dir.path() + "/" + std::to_string(static_cast<int>(opt));
    auto spec = q8_spec(3, opt, OffloadDevice::nvme, at + "/swap");
    const auto straight = test::train_mlp(spec);
    spec.steps = 3;
    spec.save_checkpoint = at + "/ckpt";
    spec.async_save = opt == OffloadDevice::cpu;
    const auto saved = test::train_mlp(spec);
    spec.async_save = false;
    // The blocks as held: 4 + 2 x 17/16 bytes an element (the layers' 1056 elements are whole
    // blocks on both ranks), in the shard files from host RAM; from NVMe, the sealed swap
    // files linked and nothing written.
    REQUIRE(saved.saved.size() == 1);
    const std::uint64_t layer = 32 * 32 + 32, bytes = 3 * (layer * 4 + 2 * layer / 16 * 17);
    const auto manifest = checkpoint::open_checkpoint(at + "/ckpt").manifest;
    CHECK(manifest.payload_bytes() == bytes);
    if (opt == OffloadDevice::nvme) {
      CHECK(saved.saved[0].bytes == 0);
      CHECK(saved.saved[0].nvme_linked_bytes == bytes);
      CHECK(saved.saved[0].nvme_copied_bytes == 0);
    }
    CHECK(manifest.version == 5);
    CHECK(manifest.blocks(checkpoint::State::exp_avg));
    const auto contents = test::checkpoint_contents(at + "/ckpt");
    spec.save_checkpoint.clear();
    spec.load_checkpoint = at + "/ckpt";
    spec.first_step = 3;
    const auto resumed = test::train_mlp(spec);
    CHECK(resumed.params == straight.params);
    CHECK(std::vector<double>(straight.losses.begin() + 3, straight.losses.end()) == resumed.losses);
    // Into a run with fp32 moments: the q8 values exactly (saved again, the same contents).
    spec.config.optimizer.moment_format = MomentFormat::fp32;
    spec.steps = 0;
    spec.save_checkpoint = at + "/widened";
    (void)test::train_mlp(spec);
    CHECK(test::checkpoint_contents(at + "/widened") == contents);
    // And that fp32 checkpoint back into a q8 run: coded to the same blocks, saved alike.
    spec.config.optimizer.moment_format = MomentFormat::q8;
    spec.load_checkpoint = at + "/widened";
    spec.save_checkpoint = at + "/again";
    (void)test::train_mlp(spec);
    CHECK(test::checkpoint_contents(at + "/again") == contents);
  }
}

TEST_CASE("a q8 checkpoint moves between world sizes and stages with its values, tensors straddling blocks",
          "[compact][q8][offload]") {
  // Hidden 20: a weight of 400 and a bias of 20 elements, so q8 blocks hold the end of one
  // tensor and the start of the next, and the ranks' shards cut the layers elsewhere at
  // world 2 than at world 1. Loading re-codes each block from the stored values: the same
  // values come back at any world size and stage, saved again as they were.
  test::TempDir dir("strata-q8-world");
  auto spec = q8_spec(3, OffloadDevice::cpu, OffloadDevice::none, dir.path() + "/swap");
  spec.hidden = 20;
  spec.steps = 3;
  spec.save_checkpoint = dir.path() + "/w2";
  (void)test::train_mlp(spec);
  const auto saved = test::checkpoint_contents(dir.path() + "/w2");
  REQUIRE(saved.at("layers.1.bias/exp_avg_sq").size() == 20 * 4);
  for (const int world : {1, 2}) {
    for (const int stage : {0, 2}) {
      INFO("world " << world << ", stage " << stage);
      auto to = q8_spec(stage, stage == 0 ? OffloadDevice::none : OffloadDevice::cpu, OffloadDevice::none,
                        dir.path() + "/swap");
      to.world = world;
      to.hidden = 20;
      to.steps = 0;
      to.load_checkpoint = dir.path() + "/w2";
      to.save_checkpoint = dir.path() + "/re" + std::to_string(world) + std::to_string(stage);
      (void)test::train_mlp(to);
      CHECK(test::checkpoint_contents(to.save_checkpoint) == saved);
    }
  }
}
