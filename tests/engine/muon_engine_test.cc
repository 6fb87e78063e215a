// Muon in the engine, on the demo MLP (one hidden matrix: the GPT's blocks, four matrices
// each, are tests/tools/muon_test.sh's): the hidden matrices (2-D, outside the first and the
// last layer) take Muon and everything else AdamW, each at its own learning rate; a Muon step
// moves a matrix by lr times an orthogonalized update (its Frobenius norm about lr
// sqrt(rank)); on two ranks the same bits with the state on the device or in host RAM, and
// through a checkpoint and a resume; on two ranks one rank's bits for the same global batch;
// at ZeRO stages 1-3 on two and three ranks, stage 0's
// bits, with the state on NVMe too (in sub-groups that cut the matrices), resumed from a
// checkpoint that links its swap files; the configs it refuses name why.
#include <tbb/global_control.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "runtime/core/error.h"
#include "tests/engine/engine_support.h"
#include "tests/engine/param_offload_support.h"
#include "tests/support/error_of.h"
#include "tests/support/same_bits.h"
#include "tests/support/temp_dir.h"

using namespace strata;
using test::same_bits;

namespace {

// TBB's loops on one thread. The orthogonalization splits its products over TBB's workers from
// the device stream's thread, and libtbb is not instrumented: ThreadSanitizer reads its work
// stealing as races. The bits do not depend on the thread count (tests/optim/muon_test.cc), so
// the ranks, streams and collectives these tests exercise are the same.
tbb::global_control one_thread() { return tbb::global_control(tbb::global_control::max_allowed_parallelism, 1); }

constexpr int kHidden = 32;
constexpr std::size_t kW = kHidden * kHidden, kLayer = kW + kHidden;  // each layer: W, then b

test::TrainSpec muon_spec(int world, int steps) {
  test::TrainSpec s;
  s.config = test::mlp_config(0, world, DType::bf16);
  s.config.optimizer.type = engine::OptimizerType::muon;
  s.config.optimizer.lr = 0.02f;
  s.config.optimizer.adam_lr = 1e-3f;
  s.world = world;
  s.layers = 3;
  s.hidden = kHidden;
  s.steps = steps;
  return s;
}

// Three steps of spec(3) saved to checkpoint `ck`, then three more loaded from it: the resumed run.
test::TrainRun save_and_resume(const std::function<test::TrainSpec(int steps)>& spec, const std::string& ck) {
  auto first = spec(3);
  first.save_checkpoint = ck;
  test::train_mlp(first);
  auto second = spec(3);
  second.first_step = 3;
  second.load_checkpoint = ck;
  auto resumed = test::train_mlp(second);
  CHECK(resumed.step_numbers == std::vector<std::int64_t>{4, 5, 6});
  return resumed;
}

// How many elements of [at, at + n) moved, and the Frobenius norm of the move.
struct Moved {
  std::size_t count = 0;
  double norm = 0;
};
Moved moved(const test::TrainRun& r, std::size_t at, std::size_t n) {
  Moved m;
  for (std::size_t i = at; i < at + n; ++i) {
    const double d = static_cast<double>(r.params[i]) - r.initial[i];
    m.count += d != 0;
    m.norm += d * d;
  }
  m.norm = std::sqrt(m.norm);
  return m;
}

}  // namespace

TEST_CASE("Muon steps the hidden matrices and AdamW the rest, each at its own rate", "[muon]") {
  const auto serial = one_thread();
  test::TrainSpec s = muon_spec(1, 1);
  s.config = test::mlp_config(0, 1, DType::fp32);
  s.config.optimizer.type = engine::OptimizerType::muon;
  s.config.gradient_clipping = 0;
  s.read_initial = true;
  SECTION("AdamW's rate 0: only layer 1's matrix moves, by lr times an orthogonalized update") {
    s.config.optimizer.lr = 0.02f;
    s.config.optimizer.adam_lr = 0.0f;
    const auto r = test::train_mlp(s);
    for (int l : {0, 2}) CHECK(moved(r, l * kLayer, kLayer).count == 0);
    CHECK(moved(r, kLayer + kW, kHidden).count == 0);  // layer 1's bias
    const Moved w = moved(r, kLayer, kW);
    CHECK(w.count > kW * 9 / 10);
    // The first step's gradient of a 32 x 32 matrix has rank at most the step's 8 samples
    // (micro-batches of 2, accumulated 4 times: mlp_config), and the nonzero
    // singular values of the orthogonalized update lie about 0.7-1.2 (newton_schulz.h): the
    // move's norm is lr sqrt(8) times about that (a square matrix: no shape factor). AdamW's
    // first step would move every element by about lr: a norm of lr x 32.
    const double unit = 0.02 * std::sqrt(8.0);
    CHECK(w.norm > 0.5 * unit);
    CHECK(w.norm < 1.25 * unit);
  }
  SECTION("Muon's rate 0: everything but layer 1's matrix moves, about lr an element") {
    s.config.optimizer.lr = 0.0f;
    s.config.optimizer.adam_lr = 1e-3f;
    const auto r = test::train_mlp(s);
    CHECK(moved(r, kLayer, kW).count == 0);
    for (int l : {0, 2}) CHECK(moved(r, l * kLayer, kLayer).count > kLayer * 9 / 10);
    CHECK(moved(r, kLayer + kW, kHidden).count == kHidden);
    const Moved w0 = moved(r, 0, kW);  // Adam's first step: every element by lr (to rounding)
    CHECK(w0.norm == Approx(1e-3 * kHidden).epsilon(0.02));
  }
}

TEST_CASE("Muon gives the same bits with its state on the device or in host RAM, and resumed", "[muon]") {
  const auto serial = one_thread();
  const auto straight = test::train_mlp(muon_spec(2, 6));
  REQUIRE(straight.losses.back() < straight.losses.front());
  auto host = muon_spec(2, 6);
  host.config.offload_optimizer.device = engine::OffloadDevice::cpu;
  CHECK(same_bits(test::train_mlp(host).params, straight.params));
  test::TempDir dir("strata-muon");
  CHECK(same_bits(save_and_resume([](int steps) { return muon_spec(2, steps); }, dir.file("ck")).params,
                  straight.params));
}

TEST_CASE("Muon at ZeRO stages 1-3 gives stage 0's bits: the ranks gather each matrix to orthogonalize it", "[muon]") {
  const auto serial = one_thread();
  // Buckets of 300 elements cut the 32 x 32 matrices, so a matrix lies in several buckets and
  // each rank's shard of a bucket holds parts of matrices; three ranks split them unevenly.
  for (const int world : {2, 3}) {
    INFO("world " << world);
    const auto reference = test::train_mlp(muon_spec(world, 4));
    test::TempDir dir("strata-muon");
    struct Case {
      int stage;
      engine::OffloadDevice opt, par;
    };
    using engine::OffloadDevice;
    for (const Case c :
         {Case{1, OffloadDevice::none, OffloadDevice::none}, Case{1, OffloadDevice::cpu, OffloadDevice::none},
          Case{2, OffloadDevice::cpu, OffloadDevice::none}, Case{3, OffloadDevice::none, OffloadDevice::none},
          Case{3, OffloadDevice::cpu, OffloadDevice::cpu}, Case{3, OffloadDevice::cpu, OffloadDevice::nvme},
          Case{1, OffloadDevice::nvme, OffloadDevice::none}, Case{2, OffloadDevice::nvme, OffloadDevice::none},
          Case{3, OffloadDevice::nvme, OffloadDevice::nvme}}) {
      INFO("stage " << c.stage << ", optimizer " << static_cast<int>(c.opt) << ", parameters "
                    << static_cast<int>(c.par));
      auto spec = muon_spec(world, 4);
      spec.config.zero.stage = c.stage;
      spec.config.zero.stage3_param_persistence_threshold = 0;
      spec.config.zero.sub_group_size = 208;  // NVMe: sub-groups of 13 blocks cut buckets and matrices
      test::place(spec.config, c.opt, c.par, dir.path());
      CHECK(same_bits(test::train_mlp(spec).params, reference.params));
    }
  }
}

TEST_CASE("Muon gives one rank's bits on two ranks for one global batch: no rank's share changes a matrix", "[muon]") {
  const auto serial = one_thread();
  // One global batch of two samples: one rank accumulating two micro-batches, or two ranks one
  // each (the trainer's samples depend on the micro-batch's place in the step, not on the
  // world size). fp32 throughout, so each gradient is the sum of the same two fp32 terms
  // (addition of two commutes), and no clipping (a norm summed over shards rounds differently
  // on more ranks). Then every bit that differs is the ranks' split of the matrices: which rank
  // owns one, and where buckets cut it.
  auto spec = [](int world, int stage) {
    auto s = muon_spec(world, 4);
    s.config = test::mlp_config(stage, world, DType::fp32, 1, 2 / world);
    s.config.optimizer.type = engine::OptimizerType::muon;
    s.config.optimizer.lr = 0.02f;
    s.config.optimizer.adam_lr = 1e-3f;
    s.config.gradient_clipping = 0;
    s.config.zero.stage3_param_persistence_threshold = 0;
    return s;
  };
  const auto one = test::train_mlp(spec(1, 0));
  for (const int stage : {0, 1, 2, 3}) {
    INFO("two ranks, stage " << stage);
    CHECK(same_bits(test::train_mlp(spec(2, stage)).params, one.params));
  }
}

TEST_CASE("Muon with its state on NVMe resumes from a checkpoint that links the swap files", "[muon]") {
  const auto serial = one_thread();
  auto reference = muon_spec(2, 6);
  reference.config.zero.stage = 2;
  const auto straight = test::train_mlp(reference);
  test::TempDir dir("strata-muon");
  const auto on_nvme = [&](int steps) {
    auto s = muon_spec(2, steps);
    s.config.zero.stage = 2;
    s.config.zero.sub_group_size = 208;
    test::place(s.config, engine::OffloadDevice::nvme, engine::OffloadDevice::none, dir.file("nvme"));
    return s;
  };
  CHECK(same_bits(save_and_resume(on_nvme, dir.file("ck")).params, straight.params));
}

TEST_CASE("Muon keeps no exp_avg_sq for its hidden matrices in device memory or host RAM", "[muon]") {
  const auto serial = one_thread();
  const auto optimizer_bytes = [](const test::TrainRun& r, bool host) {
    const auto& tier = host ? r.memory.host : r.memory.device;
    return tier.kind_used[static_cast<int>(engine::Kind::optimizer)];
  };
  const auto adamw_of = [](test::TrainSpec s) {
    s.config.optimizer.type = engine::OptimizerType::adamw;
    return s;
  };
  // Stage 0, one rank, the state on the device: the one hidden matrix (32 x 32) keeps 8 bytes
  // an element, not 12.
  auto s0 = muon_spec(1, 2);
  const auto muon0 = test::train_mlp(s0);
  const auto adamw0 = test::train_mlp(adamw_of(s0));
  CHECK(optimizer_bytes(adamw0, false) - optimizer_bytes(muon0, false) == 4 * kW);
  // Stage 2 on two ranks, the state in host RAM: rank 0's shard of the hidden layer holds 528
  // of the matrix's elements (buckets of 288, 288, 288 and 192 elements, halved; rank 1's last
  // half-bucket holds the bias), and it keeps their exp_avg_sq no more.
  auto s2 = muon_spec(2, 2);
  s2.config.zero.stage = 2;
  s2.config.offload_optimizer.device = engine::OffloadDevice::cpu;
  const auto muon2 = test::train_mlp(s2);
  const auto adamw2 = test::train_mlp(adamw_of(s2));
  CHECK(optimizer_bytes(adamw2, true) - optimizer_bytes(muon2, true) == 4 * (3 * 144 + 96));
}

TEST_CASE("Muon refuses compact moments, saying why", "[muon]") {
  const auto serial = one_thread();
  auto s = muon_spec(1, 1);
  s.config.optimizer.moment_format = MomentFormat::q8;
  CHECK_THAT(test::error_of([&] { test::train_mlp(s); }), Catch::Contains("q8 moments with optimizer Muon"));
}
