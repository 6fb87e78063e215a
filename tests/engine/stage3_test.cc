// Stage 3's gathers: trace-driven prefetch overlaps the (throttled) link with compute and
// makes a step faster, the trace shows it, a diverging trace is re-recorded, and misuse is
// refused clearly: mismatched models across ranks, a device budget below the live window.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>

#include <catch2/catch.hpp>

#include "runtime/core/error.h"
#include "runtime/core/stats.h"
#include "runtime/device/device.h"
#include "tests/engine/engine_support.h"
#include "tests/support/ranks.h"

using namespace strata;

TEST_CASE("stage 3 with prefetch is faster than without when the link and compute take known time", "[zero][stage3]") {
  // Each layer: 128x128 + 128 bf16 = 33 KiB; at 0.004 GB/s a gather moves it twice over the
  // link (shard down, layer up): ~16.5 ms; forward compute 15 ms, backward 30 ms.
  test::TrainSpec spec;
  spec.world = 1;
  spec.layers = 4;
  spec.hidden = 128;
  spec.steps = 4;
  spec.layer_ms = 15;
  spec.link_gbps = 0.004;
  spec.config = test::mlp_config(3, 1, DType::bf16, 1, 1);
  spec.config.zero.reduce_bucket_size = 1 << 20;
  spec.config.zero.stage3_param_persistence_threshold = 0;
  spec.config.zero.stage3_max_reuse_distance = 0;  // every layer is gathered twice a step
  spec.config.zero.stage3_prefetch_bucket_size = 0;
  const auto plain = test::train_mlp(spec);
  spec.config.zero.stage3_prefetch_bucket_size = 50000000;
  Tracer tracer(true);
  spec.tracer = &tracer;
  const auto prefetched = test::train_mlp(spec);
  // Step 1 records the trace; later steps prefetch.
  const std::vector<double> a(plain.step_ms.begin() + 1, plain.step_ms.end());
  const std::vector<double> b(prefetched.step_ms.begin() + 1, prefetched.step_ms.end());
  INFO("median step without prefetch " << median(a) << " ms, with prefetch " << median(b) << " ms");
  CHECK(median(b) < 0.85 * median(a));
  CHECK(std::memcmp(plain.params.data(), prefetched.params.data(), plain.params.size() * 4) == 0);

  // The timeline shows a gather running while the trainer computes.
  const auto trace = nlohmann::json::parse(tracer.to_json());
  std::map<int, std::string> lanes;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name") lanes[e["tid"].get<int>()] = e["args"]["name"];
  }
  std::vector<std::pair<double, double>> compute, gathers;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] != "X") continue;
    const auto lane = lanes[e["tid"].get<int>()];
    const std::string name = e["name"];
    const double t0 = e["ts"], t1 = t0 + e["dur"].get<double>();
    if (lane == "compute" && name.rfind("wait", 0) != 0) compute.emplace_back(t0, t1);
    if (lane == "gather" || lane == "copy") gathers.emplace_back(t0, t1);
  }
  REQUIRE(!compute.empty());
  REQUIRE(!gathers.empty());
  double overlap_us = 0;
  for (auto [g0, g1] : gathers)
    for (auto [c0, c1] : compute) overlap_us += std::max(0.0, std::min(g1, c1) - std::max(g0, c0));
  INFO("gather/compute overlap " << overlap_us / 1000 << " ms");
  CHECK(overlap_us > 20000);
}

TEST_CASE("ranks whose reductions run at different speeds make the same gathers on a full device", "[zero][stage3]") {
  // Rank 1's link is slow, so its overlapped reductions (D2H, then Gloo) finish later than
  // rank 0's. When a finished reduction freed its gradient buffer from stream work, the slow
  // rank found the device fuller at its next gradient buffer and dropped a retained layer the
  // other rank kept; re-gathering it was an all-gather only that rank issued, and the ranks
  // then ran different collectives against each other (a hang, or mixed-up sums). Buffers are
  // now freed at points of the program's own order, so every rank decides alike.
  auto cfg = test::mlp_config(3, 2, DType::bf16, 2, 4);
  cfg.zero.overlap_comm = true;
  cfg.zero.reduce_bucket_size = 4096;
  cfg.zero.stage3_param_persistence_threshold = 0;
  test::TrainSpec spec;
  spec.config = cfg;
  spec.world = 2;
  spec.layers = 6;
  spec.hidden = 128;
  spec.steps = 8;
  spec.layer_ms = 1;                // reductions of the quick rank end while it computes
  spec.device_budget = 1060 << 10;  // the minimum is 935 KiB: a window of about two layers
  spec.rank_link_gbps = {0, 0.05};  // before the fix every such run hung (9 of 9)
  const auto uneven = test::train_mlp(spec);
  spec.rank_link_gbps.clear();
  const auto even = test::train_mlp(spec);
  CHECK(uneven.params == even.params);
  CHECK(uneven.losses == even.losses);
  // The device was full: layers a roomy device keeps gathered were gathered again, which is
  // where the ranks could part.
  spec.device_budget = 64 << 20;
  CHECK(even.io.back().h2d_bytes > test::train_mlp(spec).io.back().h2d_bytes);
}

TEST_CASE("ranks that register different models are refused at setup", "[zero][negative]") {
  const auto outcomes = test::run_thread_ranks(2, [](comm::Communicator& c) {
    device::DeviceOptions d;
    auto dev = device::Device::create(d);
    engine::EngineOptions o;
    o.config = test::mlp_config(2, 2, DType::fp32);
    o.device = dev.get();
    o.comm = &c;
    engine::Engine e(o);
    e.register_param("w", {c.rank() == 0 ? 16 : 17}, 0);
    e.setup();
  });
  for (const auto& r : outcomes) {
    REQUIRE(r.error);
    CHECK_THROWS_WITH(std::rethrow_exception(r.error), Catch::Contains("registered parameters differ between ranks"));
  }
}

TEST_CASE("a device budget below stage 3's live window is refused at setup naming the minimum", "[zero][negative]") {
  device::DeviceOptions d;
  d.budget_bytes = 64 << 10;
  auto dev = device::Device::create(d);
  engine::EngineOptions o;
  o.config = test::mlp_config(3, 1, DType::bf16);
  o.device = dev.get();
  engine::Engine e(o);
  e.register_param("big.weight", {256, 256}, 0);
  e.register_param("small.weight", {16, 16}, 1);
  try {
    e.setup();
    FAIL("no error");
  } catch (const Error& err) {
    CHECK(err.code() == Errc::out_of_budget);
    CHECK_THAT(err.what(), Catch::Contains("device budget 64.00 KiB is too small for ZeRO stage 3") &&
                               Catch::Contains("needs at least") && Catch::Contains("65536 elements"));
  }
  CHECK(dev->memory_stats().used_bytes == 0);
}

TEST_CASE("a step whose gathers leave the recorded order is re-recorded, and results stay right", "[zero][stage3]") {
  auto run = [](bool shuffle) {
    device::DeviceOptions d;
    auto dev = device::Device::create(d);
    engine::EngineOptions o;
    o.config = test::mlp_config(3, 1, DType::fp32, 1, 1);
    o.config.zero.stage3_param_persistence_threshold = 0;
    o.device = dev.get();
    engine::Engine e(o);
    for (int l = 0; l < 3; ++l) e.register_param("p" + std::to_string(l), {64}, l, {engine::InitKind::uniform, 1.0f});
    e.setup();
    for (int s = 0; s < 4; ++s) {
      e.begin_step();
      std::vector<int> order = {0, 1, 2};
      if (shuffle && s == 2) order = {2, 0, 1};
      for (int l : order) {
        auto p = e.gather(l);
        auto g = e.grad_buffers(l);
        for (std::size_t i = 0; i < 64; ++i) g[0].as<float>()[i] = p[0].as<float>()[i] * 0.5f;
        e.reduce_grads(l);
        e.release(l);
      }
      e.step();
    }
    return e.full_parameters();
  };
  CHECK(run(true) == run(false));
}

TEST_CASE("misuse of the step protocol is a clear error", "[zero][negative]") {
  device::DeviceOptions d;
  auto dev = device::Device::create(d);
  engine::EngineOptions o;
  o.config = test::mlp_config(2, 1, DType::fp32, 1, 2);
  o.device = dev.get();
  engine::Engine e(o);
  CHECK_THROWS_WITH(e.gather(0), Catch::Contains("before setup()"));
  e.register_param("w", {8}, 0);
  e.setup();
  CHECK_THROWS_WITH(e.register_param("late", {8}, 0), Catch::Contains("after setup()"));
  CHECK_THROWS_WITH(e.gather(5), Catch::Contains("layer 5 has no registered parameters"));
  e.begin_step();
  e.grad_buffers(0);
  e.reduce_grads(0);
  CHECK_THROWS_WITH(e.step(), Catch::Contains("reduced its gradients 1 times") &&
                                  Catch::Contains("gradient_accumulation_steps is 2"));
  CHECK_THROWS_WITH(e.reduce_grads(0), Catch::Contains("without grad_buffers(0)"));
}

TEST_CASE("an engine whose setup failed refuses to train and shuts down cleanly", "[zero][negative]") {
  device::DeviceOptions d;
  auto dev = device::Device::create(d);
  engine::EngineOptions o;
  o.config = test::mlp_config(3, 1, DType::fp32, 1, 2);
  o.config.memory_budget.host = 64 << 10;  // the fp32 optimizer state alone needs more: setup refuses
  o.config.offload_optimizer.device = engine::OffloadDevice::cpu;
  o.device = dev.get();
  engine::Engine e(o);
  e.register_param("w", {64, 1024}, 0);
  e.register_param("b", {1024}, 1);
  CHECK_THROWS_WITH(e.setup(), Catch::Contains("host"));
  CHECK_THROWS_WITH(e.begin_step(), Catch::Contains("setup() failed on this engine"));
  CHECK_THROWS_WITH(e.begin_eval(), Catch::Contains("setup() failed on this engine"));
  CHECK_THROWS_WITH(e.reduce_grads(0), Catch::Contains("setup() failed on this engine"));
  CHECK_THROWS_WITH(e.full_parameters(), Catch::Contains("setup() failed on this engine"));
  CHECK_THROWS_WITH(e.save_checkpoint("unused"), Catch::Contains("setup() failed on this engine"));
  CHECK_NOTHROW(e.synchronize());
  CHECK_NOTHROW(e.memory());
  CHECK_NOTHROW(e.explain_placement());
}
