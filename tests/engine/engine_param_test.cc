// Stage-3 parameter offload inside the engine: bitwise-identical parameters after 10 steps
// wherever optimizer state and parameter shards live (device, host RAM, NVMe; world 1 and
// 2), the traffic each placement causes (counted per step, checked exactly where the
// placement fixes it), a model 8x the device budget and 2x the host budget trained from
// NVMe with per-tier peaks under their budgets, budget-driven placement, and the gather
// traffic of the live window. The faults are engine_param_fault_test.cc's.
#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <sstream>

#include "runtime/core/dtype.h"
#include "runtime/core/error.h"
#include "runtime/device/device.h"
#include "tests/engine/engine_support.h"
#include "tests/engine/param_offload_support.h"
#include "tests/engine/stack_trainer.h"
#include "tests/support/skip.h"
#include "tests/support/temp_dir.h"

using namespace strata;

namespace {

using engine::OffloadDevice;
using test::place;
using test::stage3_config;

const char* name(OffloadDevice d) {
  return d == OffloadDevice::none ? "device" : d == OffloadDevice::cpu ? "cpu" : "nvme";
}

}  // namespace

TEST_CASE("parameters are bitwise identical after 10 steps wherever optimizer state and parameter shards live",
          "[offload][uring]") {
  const int world = GENERATE(1, 2);
  test::TempDir dir("strata-offload");
  test::TrainSpec spec;
  spec.world = world;
  spec.steps = 10;
  spec.config = stage3_config(world);
  const auto base = test::train_mlp(spec);
  REQUIRE(base.losses.back() < base.losses.front());
  const std::pair<OffloadDevice, OffloadDevice> placements[] = {
      {OffloadDevice::none, OffloadDevice::cpu}, {OffloadDevice::none, OffloadDevice::nvme},
      {OffloadDevice::cpu, OffloadDevice::none}, {OffloadDevice::cpu, OffloadDevice::cpu},
      {OffloadDevice::cpu, OffloadDevice::nvme}, {OffloadDevice::nvme, OffloadDevice::none},
      {OffloadDevice::nvme, OffloadDevice::nvme}};
  for (const auto& [opt, par] : placements) {
    INFO("world " << world << ", optimizer on " << name(opt) << ", parameters on " << name(par));
    spec.config = stage3_config(world);
    place(spec.config, opt, par, dir.path());
    const auto run = test::train_mlp(spec);
    REQUIRE(run.params.size() == base.params.size());
    CHECK(std::memcmp(run.params.data(), base.params.data(), base.params.size() * 4) == 0);
    CHECK(run.losses == base.losses);
    const auto params = static_cast<int>(engine::Kind::params);
    // Parameter shards are where the placement says and nowhere else.
    CHECK((run.memory.device.kind_used[params] > 0) == (par == OffloadDevice::none));
    CHECK((run.memory.host.kind_used[params] > 0) == (par == OffloadDevice::cpu));
    CHECK((run.memory.nvme.kind_used[params] > 0) == (par == OffloadDevice::nvme));
    // Shards on NVMe: every step writes each updated shard once and reads them for gathers.
    for (const auto& io : run.io) {
      if (par == OffloadDevice::nvme) {
        CHECK(io.nvme_read_bytes > 0);
        if (opt != OffloadDevice::nvme) CHECK(io.nvme_write_bytes == run.io.front().nvme_write_bytes);
      } else if (opt != OffloadDevice::nvme) {
        CHECK(io.nvme_read_bytes + io.nvme_write_bytes == 0);
      }
    }
  }
  std::error_code ec;
  CHECK(std::filesystem::is_empty(dir.path(), ec));  // every swap file and directory removed
}

TEST_CASE("each step's traffic is what the placement implies", "[offload][uring]") {
  test::TempDir dir("strata-offload");
  test::TrainSpec spec;
  spec.steps = 3;
  spec.config = stage3_config(1);
  place(spec.config, OffloadDevice::cpu, OffloadDevice::nvme, dir.path());
  const auto run = test::train_mlp(spec);
  // 3 layers of 32 x 32 + 32 = 1056 parameters (a multiple of 16: no padding), bf16.
  const std::uint64_t layer_bytes = 1056 * 2, model_bytes = 3 * layer_bytes;
  const std::uint64_t accum = 4;
  // Step 1 records the trace: nothing is retained or prefetched, every gather reads its layer.
  CHECK(run.io.front().nvme_read_bytes == 2 * accum * model_bytes);
  for (const auto& io : run.io) {
    CHECK(io.d2h_bytes == accum * model_bytes);    // every micro-batch's gradients leave the device
    CHECK(io.nvme_write_bytes == model_bytes);     // each updated shard written once
    CHECK(io.nvme_read_bytes % layer_bytes == 0);  // whole layers read for gathers
    CHECK(io.nvme_read_bytes >= model_bytes);
    CHECK(io.h2d_bytes == io.nvme_read_bytes);  // what is read is gathered onto the device
  }
  CHECK(run.placement.find("3 on nvme") != std::string::npos);
}

TEST_CASE("offload_param.max_in_cpu keeps the first layers' NVMe shards in host RAM", "[offload][uring]") {
  test::TempDir dir("strata-offload");
  test::TrainSpec spec;
  spec.steps = 2;
  spec.config = stage3_config(1);
  place(spec.config, OffloadDevice::none, OffloadDevice::nvme, dir.path());
  spec.config.offload_param.max_in_cpu = 1056;  // exactly one layer's shard
  const auto run = test::train_mlp(spec);
  const auto params = static_cast<int>(engine::Kind::params);
  CHECK(run.memory.host.kind_used[params] == 1056 * 2);
  CHECK(run.memory.nvme.kind_used[params] > 0);
  CHECK(run.placement.find("1 on host, 2 on nvme") != std::string::npos);
}

TEST_CASE("a model 8x the device budget and 2x the host budget trains from NVMe within every budget",
          "[offload][uring]") {
  test::TempDir dir("strata-offload");
  test::TrainSpec spec;
  spec.layers = 16;
  spec.hidden = 128;
  spec.steps = 3;
  spec.config = test::mlp_config(3, 1, DType::bf16, 2, 2);
  spec.config.zero.stage3_param_persistence_threshold = 0;
  spec.config.zero.reduce_bucket_size = 100000000;
  spec.config.zero.sub_group_size = 4096;
  spec.config.zero.stage3_prefetch_bucket_size = 40000;
  spec.config.offload_optimizer.buffer_count = 4;
  spec.config.offload_param.buffer_size = 4096;
  spec.config.offload_param.buffer_count = 2;
  spec.config.offload_param.max_in_cpu = 0;
  place(spec.config, OffloadDevice::nvme, OffloadDevice::nvme, dir.path());
  const std::uint64_t psi = 16 * (128 * 128 + 128);
  const std::uint64_t model_states = 16 * psi;  // bf16 params and grads, fp32 master + Adam moments
  spec.device_budget = 512 << 10;
  spec.config.memory_budget.host = 2 << 20;
  spec.config.memory_budget.nvme = 32 << 20;
  REQUIRE(model_states >= 8 * spec.device_budget);
  REQUIRE(model_states >= 2 * spec.config.memory_budget.host);
  const auto run = test::train_mlp(spec);
  INFO(run.placement);
  CHECK(run.memory.device.peak_bytes <= spec.device_budget);
  CHECK(run.memory.host.peak_bytes <= spec.config.memory_budget.host);
  CHECK(run.memory.nvme.peak_bytes <= spec.config.memory_budget.nvme);
  CHECK(run.memory.nvme.peak_bytes >= 12 * psi * 2);  // both generations of the optimizer state
  // The same run with everything on a large device gives the same bits.
  auto all_device = spec;
  place(all_device.config, OffloadDevice::none, OffloadDevice::none, "");
  all_device.device_budget = 64 << 20;
  all_device.config.memory_budget = {};
  const auto ref = test::train_mlp(all_device);
  REQUIRE(ref.params.size() == run.params.size());
  CHECK(std::memcmp(ref.params.data(), run.params.data(), run.params.size() * 4) == 0);
  CHECK(ref.losses == run.losses);
}

TEST_CASE("memory_budget places each layer's state so every tier fits, without changing a bit", "[offload][uring]") {
  const int world = GENERATE(1, 2);
  const std::uint64_t host_budget = GENERATE(96 << 10, 40 << 10);
  test::TempDir dir("strata-offload");
  test::TrainSpec spec;
  spec.world = world;
  spec.steps = 10;
  spec.config = stage3_config(world);
  const auto base = test::train_mlp(spec);
  // Budget-driven: no offload device named, a device with room for the live window and a
  // little more, a host that cannot take everything, NVMe behind it.
  spec.config.offload_optimizer.nvme_path = dir.path();
  spec.config.offload_param.nvme_path = dir.path();
  spec.device_budget = 24 << 10;
  spec.config.memory_budget.device = 24 << 10;
  spec.config.offload_optimizer.buffer_count = 2;  // swap buffers: 2 x 4 KiB + 2 x 4 KiB
  spec.config.offload_param.buffer_count = 2;
  spec.config.memory_budget.host = host_budget;
  spec.config.memory_budget.nvme = 1 << 20;
  const auto run = test::train_mlp(spec);
  INFO(run.placement);
  CHECK(run.placement.find("budget-driven") != std::string::npos);
  CHECK(std::memcmp(run.params.data(), base.params.data(), base.params.size() * 4) == 0);
  CHECK(run.losses == base.losses);
  CHECK(run.memory.device.peak_bytes <= spec.config.memory_budget.device);
  CHECK(run.memory.host.peak_bytes <= spec.config.memory_budget.host);
  CHECK(run.memory.nvme.peak_bytes <= spec.config.memory_budget.nvme);
  // The budgets force state off the device: some of it is elsewhere.
  const auto opt = static_cast<int>(engine::Kind::optimizer);
  CHECK(run.memory.host.kind_used[opt] + run.memory.nvme.kind_used[opt] > 0);
  if (world == 1) CHECK((run.memory.nvme.peak_bytes > 0) == (host_budget < (96u << 10)));
}

namespace {

// A trainer that uses one layer again in every micro-batch's forward (as tied weights do):
// its gathers per step are not the host-trainer contract's forward + backward.
struct TiedRun {
  std::vector<float> params;
  std::string placement;
  engine::MemoryReport memory;
};

constexpr int kTiedH = 64;  // 64 x 64 layers: 8 KiB bf16 shards, two 4 KiB parameter-store chunks each
constexpr std::size_t kTiedN = kTiedH * kTiedH;

TiedRun train_tied(const engine::EngineConfig& c, std::uint64_t device_budget, int reused, int steps,
                   bool guard = false) {
  device::DeviceOptions d;
  d.budget_bytes = device_budget;
  d.guard_memory = guard;
  auto dev = device::Device::create(d);
  engine::EngineOptions eo;
  eo.config = c;
  eo.device = dev.get();
  eo.seed = 7;
  engine::Engine e(eo);
  for (int l = 0; l < 3; ++l) e.register_param(str_cat("layers.", l, ".weight"), {kTiedH, kTiedH}, l);
  e.setup();
  std::vector<float> p(kTiedN), g(kTiedN);
  for (int s = 0; s < steps; ++s) {
    e.begin_step();
    for (std::int64_t mb = 0; mb < c.gradient_accumulation_steps; ++mb) {
      for (int l = 0; l < 3; ++l) {
        (void)e.gather(l);
        e.release(l);
      }
      for (int k = 0; reused >= 0 && k < 4; ++k) {
        (void)e.gather(reused);
        e.release(reused);
      }
      for (int l = 3; l-- > 0;) {
        const auto pv = e.gather(l);
        const auto gv = e.grad_buffers(l);
        device::CpuAccessScope cpu(*dev);  // the views are device memory
        convert(pv[0].data, pv[0].dtype, p.data(), DType::fp32, kTiedN);
        for (std::size_t i = 0; i < kTiedN; ++i) g[i] = 0.1f * p[i] + 0.01f * static_cast<float>(mb + 1 + (i % 7));
        convert(g.data(), DType::fp32, gv[0].data, gv[0].dtype, kTiedN);
        e.reduce_grads(l);
        e.release(l);
      }
    }
    (void)e.step();
  }
  return {e.full_parameters(), e.explain_placement(), e.memory()};
}

// The params column of layer l's row in explain_placement() ("layer 0" or "layer 1 .. layer 2").
std::string layer_params_place(const std::string& text, int l) {
  std::size_t pos = 0;
  while ((pos = text.find("\n  layer ", pos)) != std::string::npos) {
    const std::size_t end = text.find('\n', pos + 1);
    const std::string row = text.substr(pos + 3, end - pos - 3);
    pos = end;
    int first = -1, last = -1;
    if (std::sscanf(row.c_str(), "layer %d .. layer %d", &first, &last) < 2) last = first;
    if (first < 0 || l < first || l > last) continue;
    std::istringstream cols(row.substr(row.find("  ")));
    std::string opt, params;
    cols >> opt >> params;
    return params;
  }
  return "";
}

}  // namespace

TEST_CASE("budget-driven placement re-places parameter shards from the recorded gather trace", "[offload][uring]") {
  test::TempDir dir("strata-offload");
  auto c = stage3_config(1);
  c.offload_param.buffer_size = 2048;  // 4 KiB chunks
  // Optimizer state pinned to NVMe; parameter shards placed by budget. The device has room
  // for its live window only. The host budget is the largest at which the contract's trace
  // (every layer gathered alike) leaves one layer's shard on NVMe: two shards fit, and the
  // slack below a third leaves room for the new store's buffer while shards move.
  auto budgeted = c;
  place(budgeted, OffloadDevice::nvme, OffloadDevice::none, dir.path());
  budgeted.memory_budget.device = kTiedN * 2 * 2 + 1000;  // one gathered layer and its gradient buffer
  budgeted.memory_budget.nvme = 8 << 20;
  TiedRun plain;
  const auto nvme_layer = [&](std::uint64_t host) {  // the layer whose shard lands on NVMe at `host`, or -1
    budgeted.memory_budget.host = host;
    plain = train_tied(budgeted, budgeted.memory_budget.device, -1, 1);
    int left = -1;
    for (int l = 0; l < 3; ++l) {
      if (layer_params_place(plain.placement, l) == "nvme") left = l;
    }
    return left;
  };
  // The largest such budget to 1 KiB: down in 8 KiB steps to the first, then up 1 KiB at a time.
  constexpr std::uint64_t kMost = 256 << 10;
  std::uint64_t host = kMost;
  while (host > (32 << 10) && nvme_layer(host) < 0) host -= 8 << 10;
  while (host < kMost && nvme_layer(host + 1024) >= 0) host += 1024;
  const int left = nvme_layer(host);
  INFO(plain.placement);
  REQUIRE(left >= 0);
  CHECK(plain.placement.find("re-placed") == std::string::npos);
  // That layer used 4 more times per micro-batch: the recorded trace moves it to host RAM.
  const auto ref = train_tied(c, 64 << 20, left, 6);
  const auto run = train_tied(budgeted, budgeted.memory_budget.device, left, 6);
  INFO(run.placement);
  CHECK(run.placement.find("re-placed after step 1 from the recorded gather trace") != std::string::npos);
  CHECK(layer_params_place(run.placement, left) == "host");
  CHECK(std::memcmp(run.params.data(), ref.params.data(), ref.params.size() * 4) == 0);
  CHECK(run.memory.host.peak_bytes <= budgeted.memory_budget.host);
  CHECK(run.memory.device.peak_bytes <= budgeted.memory_budget.device);
  if (test::missing_hardware("pku").empty()) {
    // The shards' move between tiers touches device memory only through streams.
    const auto guarded = train_tied(budgeted, budgeted.memory_budget.device, left, 6, /*guard=*/true);
    CHECK(guarded.placement == run.placement);
    CHECK(std::memcmp(guarded.params.data(), ref.params.data(), ref.params.size() * 4) == 0);
  }
}

TEST_CASE("with NVMe tiers the engine never touches device memory from the CPU (guarded host device)",
          "[offload][uring][pku]") {
  test::TempDir dir("strata-offload");
  test::TrainSpec spec;
  spec.steps = 6;
  spec.config = stage3_config(1);
  const auto base = test::train_mlp(spec);
  spec.guard_memory = true;
  const std::pair<OffloadDevice, OffloadDevice> placements[] = {{OffloadDevice::none, OffloadDevice::nvme},
                                                                {OffloadDevice::cpu, OffloadDevice::nvme},
                                                                {OffloadDevice::nvme, OffloadDevice::none},
                                                                {OffloadDevice::nvme, OffloadDevice::cpu},
                                                                {OffloadDevice::nvme, OffloadDevice::nvme}};
  for (const auto& [opt, par] : placements) {
    INFO("optimizer on " << name(opt) << ", parameters on " << name(par));
    spec.config = stage3_config(1);
    place(spec.config, opt, par, dir.path());
    const auto run = test::train_mlp(spec);
    CHECK(std::memcmp(run.params.data(), base.params.data(), base.params.size() * 4) == 0);
  }
  // Budget-driven, as in the test above.
  spec.config = stage3_config(1);
  spec.config.offload_optimizer.nvme_path = dir.path();
  spec.config.offload_param.nvme_path = dir.path();
  spec.device_budget = 24 << 10;
  spec.config.memory_budget.device = 24 << 10;
  spec.config.offload_optimizer.buffer_count = 2;
  spec.config.offload_param.buffer_count = 2;
  spec.config.memory_budget.host = 40 << 10;
  spec.config.memory_budget.nvme = 1 << 20;
  const auto run = test::train_mlp(spec);
  INFO(run.placement);
  CHECK(run.memory.nvme.peak_bytes > 0);
  CHECK(std::memcmp(run.params.data(), base.params.data(), base.params.size() * 4) == 0);
}

// [regression] A prefetch that ran one layer past stage3_max_live_parameters evicted layers
// before their use and gathered them again: 8.8x the host-to-device traffic with the same
// results, unseen by every other test. Each gather moves its layer at most once, and the
// live window holds, at every live limit.
TEST_CASE("stage 3 gather traffic per step is at most one transfer per gather, within the live window",
          "[offload][memory]") {
  const std::uint64_t max_live = GENERATE(1056u, 2u * 1056u, 1000000u);
  test::TrainSpec spec;
  spec.steps = 4;
  spec.config = stage3_config(1);
  spec.config.zero.reduce_bucket_size = 100000;  // one bucket per layer
  spec.config.zero.stage3_max_live_parameters = max_live;
  place(spec.config, OffloadDevice::cpu, OffloadDevice::cpu, "");
  const auto run = test::train_mlp(spec);
  // 3 layers of 32 x 32 + 32 = 1056 parameters, bf16; forward and backward of 4 micro-batches.
  const std::uint64_t layer_bytes = 1056 * 2, gathers = 2 * 4 * 3;
  INFO("max_live " << max_live << " peak gathered " << run.memory.peak_gathered_elems);
  CHECK(run.memory.peak_gathered_elems <= max_live);
  for (std::size_t s = 0; s < run.io.size(); ++s) {
    INFO("step " << s + 1 << ": " << run.io[s].h2d_bytes << " B host-to-device");
    CHECK(run.io[s].h2d_bytes % layer_bytes == 0);
    CHECK(run.io[s].h2d_bytes <= gathers * layer_bytes);
    CHECK(run.io[s].h2d_bytes >= 3 * layer_bytes);                 // each layer at least once
    if (s > 0) CHECK(run.io[s].h2d_bytes == run.io[1].h2d_bytes);  // the replayed trace moves the same every step
  }
}
