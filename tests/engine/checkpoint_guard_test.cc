// Checkpoints are never damaged by what comes after them, and a load that fails changes
// nothing: regression tests for the ways a committed checkpoint was lost or misread (a
// load rewriting the swap files a save had hard-linked, the next run's leftover cleanup
// removing a checkpoint's swap files, NVMe state on another filesystem, a second run on one
// save directory, a half-applied failed load, another optimizer's state), with NVMe state
// on io_uring like a user's.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "checkpoint/directory.h"
#include "checkpoint/shard_file.h"
#include "engine/engine.h"
#include "runtime/core/error.h"
#include "runtime/device/device.h"
#include "tests/engine/checkpoint_files.h"
#include "tests/engine/engine_support.h"
#include "tests/engine/stack_trainer.h"
#include "tests/support/error_of.h"
#include "tests/support/temp_dir.h"

namespace strata::test {
namespace {

namespace fs = std::filesystem;

// One rank of the MLP, 64 wide unless said.
struct Rank : MlpRank {
  explicit Rank(const engine::EngineConfig& c, int hidden = 64) : MlpRank(c, hidden) {}
};

// Stage 3 with the optimizer state (and, with `params`, the parameter shards) on NVMe in
// small sub-groups, so each layer has several swap files.
engine::EngineConfig nvme_config(const std::string& nvme, bool params = true, std::uint64_t sub_group = 1000) {
  auto c = mlp_config(3, 1, DType::bf16);
  c.offload_optimizer.device = engine::OffloadDevice::nvme;
  c.offload_optimizer.nvme_path = nvme;
  if (params) {
    c.offload_param.device = engine::OffloadDevice::nvme;
    c.offload_param.nvme_path = nvme;
    c.offload_param.buffer_count = 4;
    c.offload_param.buffer_size = 4096;
  }
  c.zero.sub_group_size = sub_group;
  c.zero.stage3_param_persistence_threshold = 0;
  return c;
}

TEST_CASE("loading one checkpoint after saving another leaves both intact",
          "[offload][uring][checkpoint][regression]") {
  // Before: a load wrote the swap files' current generation in place, and those were the
  // files the last save had hard-linked, so checkpoint B was refused after loading A.
  TempDir dir("ckpt-guard");
  Rank r(nvme_config(dir.file("nvme")));
  r.train(0, 2);
  const std::string a = r.engine->save_checkpoint(dir.file("a")).dir;
  r.train(2, 4);
  const std::string b = r.engine->save_checkpoint(dir.file("b")).dir;
  const auto files_a = checkpoint_files(a), files_b = checkpoint_files(b);
  const auto state_b = checkpoint_contents(b);
  for (int round = 0; round < 2; ++round) {
    r.engine->load_checkpoint(a);
    CHECK(checkpoint_files(b) == files_b);
    r.engine->load_checkpoint(b);
    CHECK(checkpoint_files(a) == files_a);
    r.train(4, 5);  // a step after each load rewrites both generations
  }
  CHECK(checkpoint_files(a) == files_a);
  CHECK(checkpoint_files(b) == files_b);
  // And a load followed by a save gives the loaded state back exactly.
  r.engine->load_checkpoint(b);
  CHECK(checkpoint_contents(r.engine->save_checkpoint(dir.file("c")).dir) == state_b);
}

TEST_CASE("a load that fails on a damaged tensor changes nothing, and training goes on as if it was never tried",
          "[offload][uring][checkpoint][regression]") {
  // Before: the layers before the damaged one were loaded, the later ones and the step
  // counters were not, and training went on from that mixture.
  TempDir dir("ckpt-guard");
  const bool on_nvme = GENERATE(false, true);
  INFO((on_nvme ? "optimizer state on NVMe" : "optimizer state in host RAM"));
  // 320 wide: 3.7 MB of state, four 1 MiB chunks in the shard file, the last one damaged.
  auto config = on_nvme ? nvme_config(dir.file("nvme"), false, 40000) : mlp_config(1, 1, DType::bf16);
  if (!on_nvme) config.offload_optimizer.device = engine::OffloadDevice::cpu;
  engine::SaveOptions copy;
  copy.link_nvme = false;  // the shard file holds every tensor: damage the last one's bytes
  std::string saved;
  {
    Rank src(config, 320);
    src.train(0, 3);
    saved = src.engine->save_checkpoint(dir.file("ck"), "{}", copy).dir;
  }
  damage_last_chunk(saved);

  auto other = config;  // each engine its own swap directory
  if (on_nvme) other.offload_optimizer.nvme_path = dir.file("nvme2");
  Rank tried(config, 320), untouched(other, 320);
  tried.train(0, 1);
  untouched.train(0, 1);
  CHECK_THAT(error_of([&] { tried.engine->load_checkpoint(saved); }),
             Catch::Contains("checksum") && Catch::Contains("nothing was changed"));
  tried.train(1, 3);
  untouched.train(1, 3);
  CHECK(tried.engine->full_parameters() == untouched.engine->full_parameters());
}

TEST_CASE("a checkpoint of another optimizer is refused by name, and another precision's loss scale is not taken",
          "[offload][checkpoint][regression]") {
  TempDir dir("ckpt-guard");
  auto lion = mlp_config(1, 1, DType::fp32);
  lion.offload_optimizer.device = engine::OffloadDevice::cpu;
  lion.optimizer.type = engine::OptimizerType::lion;
  std::string saved;
  {
    Rank src(lion);
    src.train(0, 2);
    saved = src.engine->save_checkpoint(dir.file("lion")).dir;
  }
  auto adamw = lion;
  adamw.optimizer.type = engine::OptimizerType::adamw;
  Rank other(adamw);
  CHECK_THAT(error_of([&] { other.engine->load_checkpoint(saved); }), Catch::Contains("holds Lion optimizer state") &&
                                                                          Catch::Contains("optimizer.type is AdamW") &&
                                                                          Catch::Contains("nothing was changed"));

  // An fp16 run resumed from an fp32 checkpoint starts its dynamic scaler at 2^16, not at
  // the scale 1 the fp32 run kept (before, it took 1 and under-scaled every gradient).
  auto fp32 = mlp_config(1, 1, DType::fp32);
  fp32.offload_optimizer.device = engine::OffloadDevice::cpu;
  std::string plain;
  {
    Rank src(fp32);
    src.train(0, 2);
    plain = src.engine->save_checkpoint(dir.file("fp32")).dir;
  }
  auto fp16 = mlp_config(1, 1, DType::fp16);
  fp16.offload_optimizer.device = engine::OffloadDevice::cpu;
  Rank half(fp16);
  const float initial = half.engine->loss_scale();
  CHECK(initial == 65536.0f);
  half.engine->load_checkpoint(plain);
  CHECK(half.engine->loss_scale() == initial);
  half.train(2, 3);
}

TEST_CASE("a checkpoint saved inside the swap directory survives the next run's cleanup of leftovers",
          "[offload][uring][checkpoint][regression]") {
  // Before: a new run removed every *.swap file below nvme_path/rank<R>, a checkpoint's
  // hard-linked optimizer state included, and --resume failed with ENOENT.
  TempDir dir("ckpt-guard");
  const std::string ck = dir.file("nvme/rank0/checkpoints");
  const auto config = nvme_config(dir.file("nvme"), false);
  std::map<std::string, std::vector<char>> state;
  {
    Rank r(config);
    r.train(0, 2);
    state = checkpoint_contents(r.engine->save_checkpoint(ck).dir);
  }
  // Leftovers of a run that died: named as a run's, where a run keeps them, and (as a killed
  // run's files are after a save) sharing their inodes with the checkpoint's files.
  std::vector<std::string> leftovers;
  for (const auto& e : fs::directory_iterator(checkpoint::open_checkpoint(ck).dir)) {
    const std::string n = e.path().filename().string();
    if (e.path().extension() != ".swap") continue;
    leftovers.push_back(dir.file("nvme/rank0/" + n.substr(n.find('.') + 1)));  // "rank00000.layer_0..." -> "layer_0..."
    fs::create_hard_link(e.path(), leftovers.back());
  }
  REQUIRE(!leftovers.empty());
  Rank next(config);
  for (const auto& l : leftovers) CHECK_FALSE((fs::exists(l) && fs::hard_link_count(l) > 1));
  next.engine->load_checkpoint(ck);
  CHECK(checkpoint_contents(ck) == state);
}

TEST_CASE("NVMe state is copied into a checkpoint on another filesystem", "[offload][uring][checkpoint][regression]") {
  // Before: link() and copy_file_range() both fail with EXDEV across filesystems, and every
  // save failed with a "full disk?" hint. /dev/shm is a tmpfs, the temp directory is not.
  TempDir dir("ckpt-guard");
  struct stat shm_st {
  }, dir_st{};
  if (::stat("/dev/shm", &shm_st) != 0 || ::stat(dir.path().c_str(), &dir_st) != 0 || shm_st.st_dev == dir_st.st_dev) {
    WARN("no /dev/shm on another filesystem than " << dir.path() << ": nothing to test");
    return;
  }
  const std::string nvme = "/dev/shm/strata-ckpt-guard-" + std::to_string(::getpid());
  struct Cleanup {
    std::string p;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(p, ec);
    }
  } cleanup{nvme};
  Rank r(nvme_config(nvme, false));
  r.train(0, 2);
  const auto saved = r.engine->save_checkpoint(dir.file("ck"));
  CHECK(saved.nvme_linked_bytes == 0);
  CHECK(saved.nvme_copied_bytes > 0);
  const auto state = checkpoint_contents(saved.dir);
  const auto o = checkpoint::open_checkpoint(saved.dir);
  checkpoint::ShardReader(o.dir, o.manifest).verify_all();
  r.train(2, 4);
  r.engine->load_checkpoint(saved.dir);
  CHECK(checkpoint_contents(r.engine->save_checkpoint(dir.file("again")).dir) == state);
}

TEST_CASE("a second run saving to the same directory is refused naming the holder, and the first run's save is kept",
          "[offload][checkpoint][regression]") {
  // Before: the second run's save cleared the first one's staging directory.
  TempDir dir("ckpt-guard");
  auto config = mlp_config(1, 1, DType::fp32);
  config.offload_optimizer.device = engine::OffloadDevice::cpu;
  Rank first(config), second(config);
  first.train(0, 1);
  second.train(0, 1);
  const std::string kept = first.engine->save_checkpoint(dir.file("ck")).dir;
  const auto files = checkpoint_files(kept);
  CHECK_THAT(error_of([&] { second.engine->save_checkpoint(dir.file("ck")); }),
             Catch::Contains("is in use by another engine of this process") && Catch::Contains("another --save-dir"));
  CHECK(checkpoint_files(kept) == files);
  first.train(1, 2);
  first.engine->save_checkpoint(dir.file("ck"));  // the holder goes on saving
  second.engine->save_checkpoint(dir.file("other"));
}

}  // namespace
}  // namespace strata::test
