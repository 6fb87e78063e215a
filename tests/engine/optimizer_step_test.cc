// The optimizer step (engine/optimizer_step.h) through the engine's contract, with gradients
// the test writes itself: the global norm, clipping and AdamW agree with a double-precision
// reference, and give the same bits at every stage, world size and tier of the optimizer
// state and parameters; an update that fails on a full NVMe device leaves the step count and
// the state where they were, so the next step gives the bits of a run that never failed.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <mutex>
#include <vector>

#include "engine/engine.h"
#include "runtime/device/device.h"
#include "tests/engine/engine_support.h"
#include "tests/engine/stack_trainer.h"
#include "tests/support/error_of.h"
#include "tests/support/file_size_limit.h"
#include "tests/support/ranks.h"
#include "tests/support/temp_dir.h"

using namespace strata;
using engine::OffloadDevice;

namespace {

constexpr int kSteps = 3;
constexpr int kMicroBatches = 4;  // over all ranks, each step
constexpr double kClip = 2.0;
const std::vector<std::int64_t> kNumel = {300, 70};  // layer 0: three buckets; layer 1: one

// Element i of parameter p's gradient in global micro-batch q of step s: a small multiple of
// 1/8 (1/32 in step 1, whose norm stays under the clipping threshold), so every sum over
// micro-batches and ranks is exact in fp32, whatever its order.
float grad_value(int s, int q, int p, std::size_t i) {
  const double unit = s == 1 ? 0.03125 : 0.125;
  return static_cast<float>(static_cast<double>(static_cast<int>((i * 7 + p * 11 + q * 5 + s * 13) % 17) - 8) * unit);
}

engine::EngineConfig step_config(int stage, int world, OffloadDevice tier, const std::string& dir) {
  auto c = test::mlp_config(stage, world, DType::fp32, 1, kMicroBatches / world);
  c.gradient_clipping = static_cast<float>(kClip);
  c.optimizer.lr = 1e-2f;
  c.zero.reduce_bucket_size = 128;
  c.zero.sub_group_size = 100;  // sub-groups cut across buckets
  c.zero.stage3_param_persistence_threshold = 0;
  c.offload_optimizer.device = tier;
  c.offload_optimizer.nvme_path = dir;
  if (stage == 3) {
    c.offload_param.device = tier;
    c.offload_param.nvme_path = dir;
  }
  return c;
}

struct StepRun {
  std::vector<float> initial, final;
  std::vector<engine::StepResult> results;
};

// One run at `world` thread ranks; rank 0's view.
StepRun run_steps(int stage, int world, OffloadDevice tier) {
  test::TempDir dir("strata-opt-step");
  StepRun out;
  std::mutex m;
  test::rethrow_first(test::run_thread_ranks(world, [&](comm::Communicator& comm) {
    auto dev = device::Device::create({});
    engine::EngineOptions o;
    o.config = step_config(stage, world, tier, dir.path());
    o.device = dev.get();
    o.comm = &comm;
    engine::Engine e(o);
    for (std::size_t p = 0; p < kNumel.size(); ++p)
      e.register_param(p == 0 ? "a" : "b", {kNumel[p]}, static_cast<int>(p), {engine::InitKind::uniform, 1.0f});
    e.setup();
    StepRun mine;
    mine.initial = e.full_parameters();
    const int accum = kMicroBatches / world;
    for (int s = 0; s < kSteps; ++s) {
      e.begin_step();
      for (int mb = 0; mb < accum; ++mb) {
        for (int layer : {1, 0}) {
          (void)e.gather(layer);
          const auto g = e.grad_buffers(layer);
          float* dst = g[0].as<float>();
          for (std::size_t i = 0; i < g[0].numel; ++i) dst[i] = grad_value(s, comm.rank() * accum + mb, layer, i);
          e.reduce_grads(layer);
          e.release(layer);
        }
      }
      mine.results.push_back(e.step());
    }
    mine.final = e.full_parameters();
    if (comm.rank() == 0) {
      std::lock_guard<std::mutex> lock(m);
      out = std::move(mine);
    }
  }));
  return out;
}

// AdamW with global-norm clipping in double precision, from the engine's initial values.
struct Reference {
  std::vector<double> p, m, v;
  std::vector<double> norms, clip_coefs;
  explicit Reference(const std::vector<float>& initial) : p(initial.begin(), initial.end()) {
    m.assign(p.size(), 0.0);
    v.assign(p.size(), 0.0);
    const double lr = 1e-2, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.01;
    for (int s = 0; s < kSteps; ++s) {
      std::vector<double> g;
      for (std::size_t pi = 0; pi < kNumel.size(); ++pi) {
        for (std::size_t i = 0; i < static_cast<std::size_t>(kNumel[pi]); ++i) {
          double sum = 0;
          for (int q = 0; q < kMicroBatches; ++q) sum += grad_value(s, q, static_cast<int>(pi), i);
          g.push_back(sum / kMicroBatches);
        }
      }
      double sq = 0;
      for (double x : g) sq += x * x;
      const double norm = std::sqrt(sq), coef = norm > kClip ? kClip / (norm + 1e-6) : 1.0;
      norms.push_back(norm);
      clip_coefs.push_back(coef);
      const double t = s + 1, bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
      for (std::size_t i = 0; i < p.size(); ++i) {
        const double gi = g[i] * coef;
        m[i] = b1 * m[i] + (1 - b1) * gi;
        v[i] = b2 * v[i] + (1 - b2) * gi * gi;
        p[i] *= 1 - lr * wd;
        p[i] -= lr / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + eps);
      }
    }
  }
};

const char* name(OffloadDevice d) {
  return d == OffloadDevice::none ? "device" : d == OffloadDevice::cpu ? "cpu" : "nvme";
}

}  // namespace

TEST_CASE("optimizer step: norm, clipping and AdamW match a double-precision reference with the same bits everywhere",
          "[offload][uring][optimizer_step]") {
  const StepRun base = run_steps(0, 1, OffloadDevice::none);
  const Reference ref(base.initial);
  REQUIRE(base.results.size() == static_cast<std::size_t>(kSteps));
  for (int s = 0; s < kSteps; ++s) {
    INFO("step " << s);
    const auto& r = base.results[s];
    CHECK(r.step == s + 1);
    CHECK_FALSE(r.skipped);
    CHECK(std::fabs(r.grad_norm - ref.norms[s]) <= 1e-12 * ref.norms[s]);
    CHECK(std::fabs(r.clip_coef - ref.clip_coefs[s]) <= 1e-12);
  }
  CHECK(base.results[0].clip_coef < 1.0);  // steps 0 and 2 are clipped, step 1 is not
  CHECK(base.results[1].clip_coef == 1.0);
  double worst = 0;
  for (std::size_t i = 0; i < ref.p.size(); ++i) worst = std::max(worst, std::fabs(base.final[i] - ref.p[i]));
  INFO("largest difference from the reference " << worst);
  CHECK(worst < 2e-6);  // a few fp32 roundings of parameters near 1, over 3 steps
  CHECK(base.final != base.initial);

  for (int world : {1, 2}) {
    for (int stage = 0; stage <= 3; ++stage) {
      for (OffloadDevice tier : {OffloadDevice::none, OffloadDevice::cpu, OffloadDevice::nvme}) {
        if (stage == 0 && tier == OffloadDevice::nvme) continue;  // NVMe state needs stage >= 1
        INFO("world " << world << " stage " << stage << " state on " << name(tier));
        const StepRun run = run_steps(stage, world, tier);
        REQUIRE(run.final.size() == base.final.size());
        CHECK(std::memcmp(run.final.data(), base.final.data(), base.final.size() * 4) == 0);
        for (int s = 0; s < kSteps; ++s) {
          CHECK(run.results[s].grad_norm == base.results[s].grad_norm);
          CHECK(run.results[s].step == s + 1);
        }
      }
    }
  }
}

TEST_CASE("optimizer step: an update that fails on a full NVMe device counts for nothing; the retry is bitwise clean",
          "[offload][uring][negative][optimizer_step]") {
  const DType compute = GENERATE(DType::bf16, DType::fp16);
  INFO("compute " << dtype_name(compute));
  test::TempDir dir("strata-opt-step"), ref_dir("strata-opt-step-ref");
  auto config = [&](const std::string& path) {
    auto c = test::mlp_config(3, 1, compute);
    c.zero.stage3_param_persistence_threshold = 0;
    c.zero.sub_group_size = 100;
    c.offload_param.max_in_cpu = 0;
    c.offload_param.buffer_size = 200;
    c.offload_optimizer.device = c.offload_param.device = OffloadDevice::nvme;
    c.offload_optimizer.nvme_path = c.offload_param.nvme_path = path;
    c.aio.block_size = 4096;
    return c;
  };
  test::MlpRank ref(config(ref_dir.path())), t(config(dir.path()));
  std::vector<test::StackStep> want;
  for (int s = 0; s < 3; ++s) want.push_back(ref.mlp->train_step(s));
  for (int s = 0; s < 2; ++s) (void)t.mlp->train_step(s);
  // Step 1's parameter write-backs run behind it on the store's queue: they land before the limit,
  // so what fails is step 2's update (under load they could still be queued, fail, and be
  // reported by step 2's first gather instead).
  t.engine->synchronize();
  std::string m;
  {
    test::FileSizeLimit limit(8192);  // swap data starts past the header and checksum table
    m = test::error_of([&] { (void)t.mlp->train_step(2); });
  }
  INFO(m);
  CHECK(m.find("EFBIG") != std::string::npos);
  // The failed step ended: a new one begins, with none of its gradients left over.
  const test::StackStep retry = t.mlp->train_step(2);
  CHECK(retry.result.step == want[2].result.step);
  CHECK(retry.result.step == 3);
  CHECK(retry.result.grad_norm == want[2].result.grad_norm);
  CHECK(retry.result.loss_scale == want[2].result.loss_scale);
  CHECK(t.engine->loss_scale() == ref.engine->loss_scale());
  const auto got = t.engine->full_parameters(), expected = ref.engine->full_parameters();
  REQUIRE(got.size() == expected.size());
  CHECK(std::memcmp(got.data(), expected.data(), got.size() * 4) == 0);
}
