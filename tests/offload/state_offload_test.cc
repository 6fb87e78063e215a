// Engine::offload_states / reload_states: between steps every byte the engine holds on the
// device moves to host RAM (the device tier's ledger at zero) and comes back bit for bit, at
// every stage and placement, frozen layers too, with training on afterwards bitwise equal to
// a run that never moved; what the host budget cannot take goes to NVMe under the nvme_path;
// without one, a host budget too small is refused with the state where it was.
// layer_parameters() (what strata.torch reads the state with, a layer at a time) gives
// full_parameters()'s values.
#include <catch2/catch.hpp>

#include <string>

#include "engine/engine.h"
#include "runtime/core/error.h"
#include "tests/engine/engine_support.h"
#include "tests/offload/param_offload_support.h"
#include "tests/support/temp_dir.h"

using namespace strata;

namespace {

using engine::OffloadDevice;

}  // namespace

TEST_CASE("offload_states leaves the device empty and reload_states gives every bit back", "[offload][uring]") {
  test::TempDir dir("strata-state-offload");
  struct Case {
    int stage;
    OffloadDevice opt, par;
    std::vector<int> frozen;
  };
  const Case cases[] = {
      {0, OffloadDevice::none, OffloadDevice::none, {}}, {1, OffloadDevice::none, OffloadDevice::none, {1}},
      {2, OffloadDevice::cpu, OffloadDevice::none, {}},  {3, OffloadDevice::none, OffloadDevice::none, {0}},
      {3, OffloadDevice::none, OffloadDevice::nvme, {}}, {3, OffloadDevice::nvme, OffloadDevice::cpu, {2}}};
  for (const auto& c : cases) {
    INFO("stage " << c.stage << ", optimizer " << static_cast<int>(c.opt) << ", parameters " << static_cast<int>(c.par)
                  << ", " << c.frozen.size() << " frozen");
    test::TrainSpec spec;
    spec.world = 2;
    spec.steps = 4;
    spec.frozen = c.frozen;
    spec.config = test::stage3_config(2);
    spec.config.zero.stage = c.stage;
    spec.config.zero.stage3_param_persistence_threshold = c.stage == 3 ? 1100 : 0;  // one layer persistent
    test::place(spec.config, c.opt, c.par, dir.path() + "/" + std::to_string(c.stage));
    const auto straight = test::train_mlp(spec);
    std::uint64_t moved = 0, device_between = ~std::uint64_t{0}, device_before = 0;
    spec.after_step = [&](engine::Engine& e, int step) {
      if (step != 1) return;
      // A layer at a time gives full_parameters()'s values (the MLP registers layer by layer).
      std::vector<float> joined;
      for (int id : e.layer_ids()) {
        const auto v = e.layer_parameters(id);
        joined.insert(joined.end(), v.begin(), v.end());
      }
      CHECK(joined == e.full_parameters());
      const auto before = e.memory().device.used_bytes;
      const auto out = e.offload_states();
      CHECK(e.states_offloaded());
      CHECK_THROWS_WITH(e.begin_step(), Catch::Contains("offload_states()): call reload_states() first"));
      CHECK_THROWS_WITH(e.full_parameters(), Catch::Contains("call reload_states() first"));
      const auto between = e.memory().device.used_bytes;
      const auto back = e.reload_states();
      CHECK(back.bytes == out.bytes);
      if (e.rank() == 0) moved = out.bytes, device_between = between, device_before = before;
    };
    const auto moved_run = test::train_mlp(spec);
    CHECK(device_between == 0);
    CHECK(moved > 0);
    CHECK(moved <= device_before);
    CHECK(moved_run.losses == straight.losses);
    CHECK(moved_run.params == straight.params);
  }
}

TEST_CASE("what host RAM cannot take goes to NVMe under the nvme_path and comes back bit for bit", "[offload][uring]") {
  test::TempDir dir("strata-state-spill");
  test::TrainSpec spec;
  spec.steps = 3;
  spec.config = test::mlp_config(0, 1, DType::fp32, 2, 1);
  const auto straight = test::train_mlp(spec);
  spec.config.memory_budget.host = 48 << 10;  // room for setup and part of the 64 KiB on the device
  spec.config.offload_param.nvme_path = dir.path();
  std::uint64_t to_nvme = 0, nvme_between = 0, device_between = 1;
  spec.after_step = [&](engine::Engine& e, int step) {
    if (step != 0) return;
    const auto out = e.offload_states();
    to_nvme = out.nvme_bytes;
    nvme_between = e.memory().nvme.used_bytes;
    device_between = e.memory().device.used_bytes;
    const auto back = e.reload_states();
    CHECK(back.bytes == out.bytes);
    CHECK(back.nvme_bytes == out.nvme_bytes);
    CHECK(e.memory().nvme.used_bytes == 0);  // the spill's files are gone
  };
  const auto run = test::train_mlp(spec);
  CHECK(device_between == 0);
  CHECK(to_nvme > 0);
  CHECK(nvme_between > to_nvme);  // both generations of its files are charged
  CHECK(run.params == straight.params);
  CHECK(run.losses == straight.losses);
}

TEST_CASE("offload_states into a host budget too small is refused and leaves the state on the device",
          "[offload][negative]") {
  test::TrainSpec spec;
  spec.steps = 2;
  spec.config = test::mlp_config(0, 1, DType::fp32, 2, 1);
  const auto straight = test::train_mlp(spec);
  spec.config.memory_budget.host = 32 << 10;  // room for setup, not for the 64 KiB on the device
  std::string error;
  spec.after_step = [&](engine::Engine& e, int step) {
    if (step != 0) return;
    const auto before = e.memory().device.used_bytes;
    try {
      e.offload_states();
    } catch (const Error& err) {
      error = err.what();
    }
    CHECK(!e.states_offloaded());
    CHECK(e.memory().device.used_bytes == before);
  };
  const auto run = test::train_mlp(spec);
  INFO(error);
  CHECK(error.find("host tier: cannot allocate") != std::string::npos);
  CHECK(run.params == straight.params);
}
