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
#include "tests/engine/param_offload_support.h"
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
    // Catch2 is not thread-safe: each rank's hook records what it saw; the checks run below.
    struct Seen {
      bool layers_join = false, offloaded = false;
      std::string begin_error, read_error;
      std::uint64_t moved = 0, back = 0, before = 0, between = ~std::uint64_t{0};
    };
    Seen seen[2];
    spec.after_step = [&](engine::Engine& e, int step) {
      if (step != 1) return;
      Seen& s = seen[e.rank()];
      // A layer at a time gives full_parameters()'s values (the MLP registers layer by layer).
      std::vector<float> joined;
      for (int id : e.layer_ids()) {
        const auto v = e.layer_parameters(id);
        joined.insert(joined.end(), v.begin(), v.end());
      }
      s.layers_join = joined == e.full_parameters();
      s.before = e.memory().device.used_bytes;
      s.moved = e.offload_states().bytes;
      s.offloaded = e.states_offloaded();
      const auto error_of = [](auto&& call) {
        try {
          call();
        } catch (const Error& err) {
          return std::string(err.what());
        }
        return std::string("(no error)");
      };
      s.begin_error = error_of([&] { e.begin_step(); });
      s.read_error = error_of([&] { e.full_parameters(); });
      s.between = e.memory().device.used_bytes;
      s.back = e.reload_states().bytes;
    };
    const auto moved_run = test::train_mlp(spec);
    for (const Seen& s : seen) {
      CHECK(s.layers_join);
      CHECK(s.offloaded);
      CHECK_THAT(s.begin_error, Catch::Contains("offload_states()): call reload_states() first"));
      CHECK_THAT(s.read_error, Catch::Contains("call reload_states() first"));
      CHECK(s.between == 0);
      CHECK(s.back == s.moved);
    }
    CHECK(seen[0].moved > 0);
    CHECK(seen[0].moved <= seen[0].before);
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
  std::uint64_t to_nvme = 0, nvme_between = 0, device_between = 1, nvme_after = 1;
  engine::Engine::StateMove out, back;
  spec.after_step = [&](engine::Engine& e, int step) {  // records only: the rank runs on a thread
    if (step != 0) return;
    out = e.offload_states();
    to_nvme = out.nvme_bytes;
    nvme_between = e.memory().nvme.used_bytes;
    device_between = e.memory().device.used_bytes;
    back = e.reload_states();
    nvme_after = e.memory().nvme.used_bytes;
  };
  const auto run = test::train_mlp(spec);
  CHECK(back.bytes == out.bytes);
  CHECK(back.nvme_bytes == out.nvme_bytes);
  CHECK(nvme_after == 0);  // the spill's files are gone
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
  bool offloaded = true;
  std::uint64_t before = 0, after = 1;
  spec.after_step = [&](engine::Engine& e, int step) {  // records only: the rank runs on a thread
    if (step != 0) return;
    before = e.memory().device.used_bytes;
    try {
      e.offload_states();
    } catch (const Error& err) {
      error = err.what();
    }
    offloaded = e.states_offloaded();
    after = e.memory().device.used_bytes;
  };
  const auto run = test::train_mlp(spec);
  CHECK(!offloaded);
  CHECK(after == before);
  INFO(error);
  CHECK(error.find("host tier: cannot allocate") != std::string::npos);
  CHECK(run.params == straight.params);
}
