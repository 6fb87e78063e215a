// Compact optimizer state: bf16 moments (bf16.bf16_optimizer_states) and q8 moments
// (optimizer.moments "q8"). The demo MLP trains bitwise alike with either at every stage and
// wherever the state lives (device, host RAM, NVMe, the overlapped step), the ledger holds 8
// (6.125) bytes an element of state instead of 12 on every tier, the run stays close to the
// fp32-moment run without being it, and offload_states moves the moments off the device and
// back bit for bit. bf16 moments: checkpoints store them in two bytes (raw shard files and
// linked NVMe swap files alike) and resume bitwise, and a checkpoint of either format loads
// into a run of the other (q8 checkpoints: q8_state_test.cc).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "tests/engine/engine_support.h"
#include "tests/engine/param_offload_support.h"
#include "tests/support/temp_dir.h"

using namespace strata;

namespace {

using engine::OffloadDevice;

test::TrainSpec bf16_moments_spec(int stage, OffloadDevice opt, OffloadDevice par, const std::string& dir,
                                  MomentFormat format = MomentFormat::bf16) {
  test::TrainSpec spec;
  spec.world = 2;
  spec.steps = 6;
  spec.config = test::stage3_config(2);
  spec.config.zero.stage = stage;
  spec.config.zero.stage3_param_persistence_threshold = stage == 3 ? 1100 : 0;  // one layer persistent
  spec.config.optimizer.moment_format = format;
  test::place(spec.config, opt, par, dir);
  return spec;
}

}  // namespace

TEST_CASE("compact moments train bitwise alike at every stage and placement, in 8 or 6.125 bytes an element",
          "[compact][uring]") {
  struct Format {
    MomentFormat format;
    std::uint64_t num, den;  // optimizer bytes against fp32 moments': 8/12, and 6.125/12 = 49/96
    double drift;            // the bound on the distance from the fp32-moment run, in lr x steps
  };
  // bf16 rounds each moment to 8 significant bits; q8 reads m within 1/8 and sqrt(v) within
  // 1/16, so a step's update lr x m / sqrt(v) is within about 20% of lr (Adam moves a weight
  // at most ~lr a step early on): a quarter of lr a step bounds the drift.
  for (const Format f : {Format{MomentFormat::bf16, 2, 3, 0.05}, Format{MomentFormat::q8, 49, 96, 0.25}}) {
    INFO(moment_format_name(f.format) << " moments");
    test::TempDir dir("strata-compact");
    const auto reference =
        test::train_mlp(bf16_moments_spec(0, OffloadDevice::none, OffloadDevice::none, dir.path(), f.format));
    REQUIRE(reference.losses.back() < reference.losses.front());
    struct Case {
      int stage;
      OffloadDevice opt, par;
      bool overlap;
    };
    const Case cases[] = {
        {1, OffloadDevice::none, OffloadDevice::none, false}, {2, OffloadDevice::cpu, OffloadDevice::none, false},
        {2, OffloadDevice::cpu, OffloadDevice::none, true},   {3, OffloadDevice::nvme, OffloadDevice::none, false},
        {3, OffloadDevice::nvme, OffloadDevice::nvme, true},  {3, OffloadDevice::cpu, OffloadDevice::cpu, true}};
    for (const auto& c : cases) {
      INFO("stage " << c.stage << ", optimizer " << static_cast<int>(c.opt) << ", parameters "
                    << static_cast<int>(c.par) << (c.overlap ? ", overlapped" : ""));
      auto spec = bf16_moments_spec(c.stage, c.opt, c.par, dir.path() + "/" + std::to_string(&c - cases), f.format);
      spec.config.offload_optimizer.overlap_step = c.overlap;
      const auto run = test::train_mlp(spec);
      CHECK(run.losses == reference.losses);
      CHECK(run.params == reference.params);
      // The same run with fp32 moments: 12 bytes an element of state.
      spec.config.optimizer.moment_format = MomentFormat::fp32;
      const auto wide = test::train_mlp(spec);
      const auto opt = test::kind_bytes(run.memory, engine::Kind::optimizer);
      const auto opt_wide = test::kind_bytes(wide.memory, engine::Kind::optimizer);
      if (c.opt != OffloadDevice::nvme) {
        CHECK(opt * f.den == opt_wide * f.num);
      } else if (c.par == OffloadDevice::none) {
        // Tiny sub-groups fill the same 4 KiB blocks either way; the bytes a step moves show it.
        CHECK(run.io.back().nvme_read_bytes * f.den == wide.io.back().nvme_read_bytes * f.num);
        CHECK(run.io.back().nvme_write_bytes * f.den == wide.io.back().nvme_write_bytes * f.num);
      }
      // Close to the fp32-moment run and not that run.
      REQUIRE(wide.params.size() == run.params.size());
      CHECK(wide.params != run.params);
      double worst = 0;
      for (std::size_t i = 0; i < run.params.size(); ++i)
        worst = std::max(worst, std::abs(static_cast<double>(run.params[i]) - wide.params[i]));
      const double lr = spec.config.optimizer.lr;
      CHECK(worst < f.drift * lr * spec.steps);
    }
  }
}

TEST_CASE("Lion and Adagrad keep their one bf16 moment alike on the device and in the overlapped step", "[compact]") {
  test::TempDir dir("strata-compact-opt");
  for (const engine::OptimizerType type : {engine::OptimizerType::lion, engine::OptimizerType::adagrad}) {
    INFO("optimizer " << engine::optimizer_type_name(type));
    auto spec = bf16_moments_spec(0, OffloadDevice::none, OffloadDevice::none, dir.path());
    spec.config.optimizer.type = type;
    spec.config.optimizer.lr = 1e-3f;
    const auto device = test::train_mlp(spec);
    auto host = bf16_moments_spec(2, OffloadDevice::cpu, OffloadDevice::none, dir.path());
    host.config.optimizer = spec.config.optimizer;
    host.config.offload_optimizer.overlap_step = true;  // the unused moment is copied over as it is
    const auto overlapped = test::train_mlp(host);
    CHECK(overlapped.params == device.params);
    CHECK(overlapped.losses == device.losses);
    // Held in two bytes (Lion's update is a sign, which six steps of rounded moments need not move).
    spec.config.optimizer.moment_format = MomentFormat::fp32;
    const auto wide = test::train_mlp(spec);
    CHECK(test::kind_bytes(device.memory, engine::Kind::optimizer) * 3 ==
          test::kind_bytes(wide.memory, engine::Kind::optimizer) * 2);
    if (type == engine::OptimizerType::adagrad) CHECK(wide.params != device.params);
  }
}

TEST_CASE("a checkpoint stores bf16 moments as they are held and resumes bitwise", "[compact][offload][uring]") {
  test::TempDir dir("strata-compact-ckpt");
  for (const OffloadDevice opt : {OffloadDevice::cpu, OffloadDevice::nvme}) {
    INFO("optimizer " << static_cast<int>(opt));
    const std::string at = dir.path() + "/" + std::to_string(static_cast<int>(opt));
    auto spec = bf16_moments_spec(3, opt, OffloadDevice::nvme, at + "/swap");
    const auto straight = test::train_mlp(spec);
    spec.steps = 3;
    spec.save_checkpoint = at + "/ckpt";
    spec.async_save = opt == OffloadDevice::cpu;  // the background writer's staging holds 8 bytes an element too
    (void)test::train_mlp(spec);
    spec.async_save = false;
    const auto contents = test::checkpoint_contents(at + "/ckpt");
    spec.save_checkpoint.clear();
    spec.load_checkpoint = at + "/ckpt";
    spec.first_step = 3;
    const auto resumed = test::train_mlp(spec);
    CHECK(resumed.params == straight.params);
    CHECK(std::vector<double>(straight.losses.begin() + 3, straight.losses.end()) == resumed.losses);
    // Every stored moment is a bf16 value (its low 16 bits zero once widened).
    const auto& m = contents.at("layers.1.weight/exp_avg_sq");
    REQUIRE(m.size() == 32 * 32 * 4);
    bool bf16_values = true, nonzero = false;
    for (std::size_t i = 0; i < m.size(); i += 4) {
      bf16_values = bf16_values && m[i] == 0 && m[i + 1] == 0;
      nonzero = nonzero || m[i + 2] != 0 || m[i + 3] != 0;
    }
    CHECK(bf16_values);
    CHECK(nonzero);
    // The same checkpoint into a run with fp32 moments: widened exactly, training goes on.
    spec.config.optimizer.moment_format = MomentFormat::fp32;
    spec.steps = 0;
    spec.save_checkpoint = at + "/widened";
    (void)test::train_mlp(spec);
    const auto widened = test::checkpoint_contents(at + "/widened");
    CHECK(widened == contents);
  }
}

TEST_CASE("the raw shard file of bf16 moments is 8 bytes an element, an fp32 checkpoint loads rounded",
          "[compact][offload]") {
  test::TempDir dir("strata-compact-size");
  test::TrainSpec spec;
  spec.steps = 2;
  spec.config = test::mlp_config(2, 1, DType::bf16, 2, 1);
  spec.config.offload_optimizer.device = OffloadDevice::cpu;
  spec.save_checkpoint = dir.path() + "/wide";
  const auto wide = test::train_mlp(spec);
  spec.config.optimizer.moment_format = MomentFormat::bf16;
  spec.save_checkpoint = dir.path() + "/narrow";
  const auto narrow = test::train_mlp(spec);
  REQUIRE(wide.saved.size() == 1);
  REQUIRE(narrow.saved.size() == 1);
  const std::uint64_t elems = 3 * (32 * 32 + 32);
  CHECK(wide.saved[0].bytes == elems * 12);
  CHECK(narrow.saved[0].bytes == elems * 8);
  // The fp32 checkpoint into the bf16-moment run: the masters exactly, the moments rounded.
  spec.load_checkpoint = dir.path() + "/wide";
  spec.save_checkpoint = dir.path() + "/rounded";
  spec.steps = 0;
  (void)test::train_mlp(spec);
  const auto from = test::checkpoint_contents(dir.path() + "/wide");
  const auto to = test::checkpoint_contents(dir.path() + "/rounded");
  CHECK(to.at("layers.0.weight/master") == from.at("layers.0.weight/master"));
  const auto& fm = from.at("layers.0.weight/exp_avg");
  const auto& tm = to.at("layers.0.weight/exp_avg");
  REQUIRE(fm.size() == tm.size());
  CHECK(fm != tm);
  for (std::size_t i = 0; i < fm.size(); i += 4) {
    float a = 0, b = 0;
    std::memcpy(&a, fm.data() + i, 4);
    std::memcpy(&b, tm.data() + i, 4);
    REQUIRE(std::abs(a - b) <= std::abs(a) * (1.0f / 256));  // half a bf16 ulp
  }
}

TEST_CASE("offload_states moves compact moments off the device and back bit for bit", "[compact][offload]") {
  for (const MomentFormat f : {MomentFormat::bf16, MomentFormat::q8}) {
    INFO(moment_format_name(f) << " moments");
    test::TrainSpec spec;
    spec.steps = 3;
    spec.config = test::mlp_config(0, 1, DType::bf16, 2, 1);
    spec.config.optimizer.moment_format = f;
    const auto straight = test::train_mlp(spec);
    std::uint64_t moved = 0, device_between = 1;
    spec.after_step = [&](engine::Engine& e, int step) {  // records only: the rank runs on a thread
      if (step != 0) return;
      moved = e.offload_states().bytes;
      device_between = e.memory().device.used_bytes;
      e.reload_states();
    };
    const auto run = test::train_mlp(spec);
    CHECK(device_between == 0);
    CHECK(moved > 0);
    CHECK(run.params == straight.params);
    CHECK(run.losses == straight.losses);
  }
}
