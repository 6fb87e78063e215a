// The replay of a stage's device buffers (pipeline/memory.h) against the executor: for every
// schedule, re-materialization mode and a model whose layers differ in width, saved tensors
// and whether they split their backward, the replayed peak is the peak the stage's device
// measured, byte for byte, and the live micro-batches are the executor's; and a pool with the
// replayed slots per buffer size holds each stage's buffers (one slot fewer does not).
#include <catch2/catch.hpp>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "pipeline/generators.h"
#include "pipeline/layers.h"
#include "pipeline/memory.h"
#include "pipeline/runner.h"
#include "pipeline/transport.h"
#include "runtime/device/arena.h"
#include "runtime/device/pool_device.h"
#include "tests/pipeline/common.h"

using namespace strata;
using namespace strata::pipeline;

namespace {

// Widths alternating 12 and 20 (12 at both ends, as the synthetic input and loss take),
// every third layer unable to split its backward, and every fourth (from the second) a
// TimedLayer: no saved tensor, so zero-byte allocations.
PipelineModel uneven_model(int layers, int micro_batches) {
  auto m = synthetic_model({.layers = layers, .width = 12, .rows = 3, .micro_batches = micro_batches, .seed = 5});
  std::size_t w = 12;
  for (int i = 0; i < layers; ++i) {
    const bool last_two = i >= layers - 2;
    if (i % 4 == 1 && !last_two) {
      m.layers[i] =
          std::make_shared<TimedLayer>(w, TimedLayer::Duration(0), TimedLayer::Duration(0), TimedLayer::Duration(0));
      continue;
    }
    const std::size_t next = i == layers - 1 ? 12 : w == 12 ? 20 : 12;
    m.layers[i] = std::make_shared<TanhLinear>(w, next, (i + 1) % 3 != 0);
    w = next;
  }
  return m;
}

}  // namespace

TEST_CASE("the replayed device peak of every stage is the executor's, byte for byte", "[pipeline]") {
  const Schedule s = GENERATE(gpipe(4, 8), one_f_one_b(4, 8), interleaved_1f1b(4, 8, 2), interleaved_1f1b(1, 3, 4),
                              zb_h1(4, 8), zb_h2(4, 6), test::auto_schedule(4, 8));
  const Remat remat = GENERATE(Remat::never, Remat::always, Remat::except_last);
  INFO(s.kind << " p=" << s.stages << " m=" << s.micro_batches << " v=" << s.chunks << " remat=" << remat_name(remat));
  const PipelineModel model = uneven_model(8, s.micro_batches);
  auto stores = test::stage_stores(s, model, 3);
  ExecutorOptions o;
  o.remat = remat;
  const auto reports = run_stages_as_threads(s, model, test::pointers(stores), o, 2);
  for (int st = 0; st < s.stages; ++st) {
    INFO("stage " << st);
    const StageMemory replay = stage_memory(s, st, model, remat, device::Arena::kAlignment, device::Backend::host);
    CHECK(replay.peak_bytes == reports[st].peak_device_bytes);
    CHECK(replay.peak_live == static_cast<int>(reports[st].peak_activations * s.chunks + 0.5));
  }
}

TEST_CASE("re-materialization lowers the replayed peak", "[pipeline]") {
  const Schedule s = gpipe(2, 8);
  const PipelineModel model = uneven_model(8, 8);
  const auto never = stage_memory(s, 0, model, Remat::never, 256, device::Backend::host).peak_bytes;
  const auto always = stage_memory(s, 0, model, Remat::always, 256, device::Backend::host).peak_bytes;
  CHECK(always * 2 < never);
  CHECK_THROWS_WITH(stage_memory(s, 2, model, Remat::never, 256, device::Backend::host), Catch::Contains("stage 2"));
}

namespace {

// Each stage's buffers per size (rounded bytes) as the replay counts them.
std::vector<std::map<std::uint64_t, int>> slots_per_stage(const Schedule& s, const PipelineModel& model, Remat remat) {
  std::vector<std::map<std::uint64_t, int>> out;
  for (int st = 0; st < s.stages; ++st)
    out.push_back(stage_memory(s, st, model, remat, device::Arena::kAlignment, device::Backend::host).peak_by_size);
  return out;
}

// Two steps with stage st's buffers in a pool of its own with slots[st]; "" or what failed.
std::string run_in_pools(const Schedule& s, const PipelineModel& model, Remat remat,
                         const std::vector<std::map<std::uint64_t, int>>& slots) {
  auto parent = device::Device::create({});
  std::vector<std::unique_ptr<device::PoolDevice>> pools;
  for (int st = 0; st < s.stages; ++st)
    pools.push_back(std::make_unique<device::PoolDevice>(*parent, slots[st], "stage " + std::to_string(st)));
  auto stores = test::stage_stores(s, model, 3);
  LocalMailboxes boxes;
  std::vector<std::string> errors(static_cast<std::size_t>(s.stages));
  std::vector<std::thread> threads;
  for (int st = 0; st < s.stages; ++st) {
    threads.emplace_back([&, st] {
      try {
        LocalTransport transport(boxes, st);
        ExecutorOptions o;
        o.remat = remat;
        o.shared_device = pools[st].get();
        StageExecutor exec(s, st, model, *stores[st], transport, o);
        for (int k = 0; k < 2; ++k) exec.run_step();
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(st)] = e.what();
        boxes.abort("stage " + std::to_string(st) + " failed");
      }
    });
  }
  for (auto& t : threads) t.join();
  std::string all;
  for (const auto& e : errors) all += e.empty() ? "" : e + "\n";
  return all;
}

}  // namespace

// The slots the replay counts hold every buffer a stage's executor allocates, in whatever
// order they come: no schedule can fragment a stage's pool. The counts are tight: a slot
// fewer of any size on any stage fails.
TEST_CASE("a pool with the replayed slots per buffer size holds every stage's buffers", "[pipeline]") {
  const Schedule s = GENERATE(gpipe(4, 8), one_f_one_b(4, 8), interleaved_1f1b(4, 8, 2), zb_h1(4, 8), zb_h2(4, 6),
                              test::auto_schedule(4, 8), gpipe(1, 4), interleaved_1f1b(1, 3, 4));
  const Remat remat = GENERATE(Remat::never, Remat::always);
  INFO(s.kind << " p=" << s.stages << " m=" << s.micro_batches << " v=" << s.chunks << " remat=" << remat_name(remat));
  const PipelineModel model = uneven_model(8, s.micro_batches);
  const auto slots = slots_per_stage(s, model, remat);
  CHECK(run_in_pools(s, model, remat, slots) == "");
  for (int st = 0; st < s.stages; ++st) {
    const auto replay = stage_memory(s, st, model, remat, device::Arena::kAlignment, device::Backend::host);
    CHECK(replay.pool_bytes() >= replay.peak_bytes);
    CHECK(replay.fits_in(replay));
    for (const auto& [size, count] : slots[static_cast<std::size_t>(st)]) {
      auto fewer = slots;
      --fewer[static_cast<std::size_t>(st)][size];
      INFO("stage " << st << ": one slot of " << size << " B fewer than " << count);
      CHECK_THAT(run_in_pools(s, model, remat, fewer),
                 Catch::Contains("cannot allocate") && Catch::Contains("slots of that size"));
      CHECK_FALSE(replay.fits_in(StageMemory{0, 0, fewer[static_cast<std::size_t>(st)]}));
    }
  }
}
