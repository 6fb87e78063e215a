// GatherPath (engine/gather_path.h) on its own, on the host device: a gather hands out the
// whole layer assembled from every rank's shards (world 1 and 2, shards on the device or in
// host RAM); the first step's order is adopted at end_step and replayed to prefetch the next
// layer within the window (dropping retained layers due after it when the device is full); a
// released layer due again soon stays retained until room is needed; persistent layers are
// counted but not gathered; the live-parameter limit refuses with the numbers; every buffer
// goes back to the ledger.
#include <cstring>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/gather_path.h"
#include "runtime/core/error.h"
#include "tests/engine/engine_support.h"
#include "tests/support/ranks.h"

using namespace strata;
using namespace strata::engine;

namespace {

// Layers of 10 + 7 l elements, or of `elems` each.
std::vector<ParamSpec> model(int layers, std::size_t elems = 0) {
  std::vector<ParamSpec> p(layers);
  for (int l = 0; l < layers; ++l) {
    p[l].name = "l" + std::to_string(l) + ".w";
    p[l].shape = {elems > 0 ? static_cast<std::int64_t>(elems) : 10 + 7 * l};
    p[l].layer = l;
  }
  return p;
}

// The value element i of layer li holds (exact in fp32).
float value(int li, std::size_t i) { return static_cast<float>(1000 * li + static_cast<int>(i)); }

struct Fixture {
  Layout lay;
  std::unique_ptr<device::Device> dev;
  MemoryLedger ledger;
  EngineConfig cfg;
  IoStats io;
  std::unique_ptr<NvmeHomes> nvme;
  std::vector<std::vector<float>> shards;  // this rank's shards per layer, host tier
  std::unique_ptr<ShardMap> map;           // every layer's shards in host RAM
  std::unique_ptr<GatherPath> path;

  Fixture(int layers, comm::Communicator* comm, int rank, int world, std::vector<bool> persistent = {},
          std::size_t elems = 0, std::uint64_t device_bytes = 4 << 20)
      : lay(model(layers, elems), world, elems > 0 ? elems : 16),
        dev(test::host_device(device_bytes, 4 << 20)),
        ledger(*dev, 16 << 20, false) {
    cfg.zero.stage = 3;
    nvme = std::make_unique<NvmeHomes>(NvmeHomes::Context{cfg, lay, rank, 4, *dev, ledger, nullptr});
    for (int li = 0; li < layers; ++li) {
      const auto& L = lay.layers()[li];
      auto& s = shards.emplace_back();
      for (int bi : L.buckets) {
        const auto& b = lay.buckets()[bi];
        for (std::size_t j = 0; j < b.shard; ++j)
          s.push_back(value(li, b.flat_offset - L.flat_offset + rank * b.shard + j));
      }
    }
    if (persistent.empty()) persistent.assign(layers, false);
    map = std::make_unique<ShardMap>(persistent);
    for (int li = 0; li < layers; ++li) map->place(li, Tier::host, Tier::host);
    const GatherPath::Context c{lay,
                                cfg.zero,
                                rank,
                                world,
                                DType::fp32,
                                *dev,
                                ledger,
                                comm,
                                nullptr,
                                nullptr,
                                io,
                                *nvme,
                                *map,
                                [this](int li) -> const void* { return shards[li].data(); },
                                [] { return std::uint64_t{0}; }};
    path = std::make_unique<GatherPath>(c);
  }

  // "" when the gathered buffer of layer li holds the whole layer (padding included).
  std::string check(int li, const void* buf) const {
    const auto& L = lay.layers()[li];
    std::vector<float> got(L.padded);
    std::memcpy(got.data(), buf, L.padded * 4);
    for (std::size_t i = 0; i < L.padded; ++i)
      if (got[i] != value(li, i)) return "layer " + std::to_string(li) + " element " + std::to_string(i);
    return "";
  }
};

}  // namespace

TEST_CASE("gather path: a gather assembles the layer from every rank's shards", "[engine][gather_path]") {
  for (const int world : {1, 2}) {
    INFO("world " << world);
    const auto outcomes = test::run_thread_ranks(world, [&](comm::Communicator& comm) {
      Fixture f(3, world > 1 ? &comm : nullptr, comm.rank(), world);
      f.path->begin_step();
      for (int li = 0; li < 3; ++li) {
        const std::string bad = f.check(li, f.path->gather(li, false, 1));
        STRATA_CHECK(bad.empty(), Errc::internal, "rank ", comm.rank(), ": ", bad);
        f.path->release(li, false);
      }
      STRATA_CHECK(f.path->end_step(1), Errc::internal, "the first step's trace was not adopted");
      STRATA_CHECK(f.path->live_elems() == 0, Errc::internal, "layers left gathered after end_step");
    });
    CHECK_NOTHROW(test::rethrow_first(outcomes));
  }
}

TEST_CASE("gather path: the recorded order prefetches the next layer and retains a near reuse",
          "[engine][gather_path]") {
  Fixture f(3, nullptr, 0, 1);
  const auto& L = f.lay.layers();
  // Step 1: forward 0 1 2, backward 2 1 0; adopted as the trace.
  const std::vector<int> order{0, 1, 2, 2, 1, 0};
  f.path->begin_step();
  for (int li : order) {
    f.path->gather(li, false, 1);
    f.path->release(li, false);
  }
  CHECK(f.path->end_step(1));
  CHECK(f.path->trace().trace() == order);
  // Step 2 replays it: gathering layer 0 prefetches the layers after it (the window holds them).
  f.path->begin_step();
  CHECK(f.check(0, f.path->gather(0, false, 2)) == "");
  CHECK(f.path->live_elems() == L[0].padded + L[1].padded + L[2].padded);  // prefetch window is large
  f.path->release(0, false);  // layer 0 is due again at the end: within the reuse distance
  CHECK(f.path->live_elems() == L[0].padded + L[1].padded + L[2].padded);
  CHECK(f.path->drop_retained());  // room needed: the retained layer used furthest ahead goes
  CHECK(f.path->live_elems() == L[1].padded + L[2].padded);
  for (int li : {1, 2, 2, 1, 0}) {
    CHECK(f.check(li, f.path->gather(li, false, 2)) == "");
    f.path->release(li, false);
  }
  CHECK_FALSE(f.path->end_step(2));  // followed the trace: nothing new to adopt
  CHECK(f.path->live_elems() == 0);
  CHECK(f.path->peak_live_elems() == L[0].padded + L[1].padded + L[2].padded);
  CHECK(f.io.h2d_bytes > 0);
}

// Retained layers that fill the device do not stop the prefetch: it drops the one due
// furthest ahead (as the on-demand gather would), never one due before the layer it reads.
TEST_CASE("gather path: a device full of retained layers still prefetches", "[engine][gather_path]") {
  constexpr std::size_t kElems = 64 << 10;                               // 256 KiB a layer in fp32
  Fixture f(8, nullptr, 0, 1, {}, kElems, 4 * kElems * 4 + (64 << 10));  // room for four layers
  f.cfg.zero.stage3_prefetch_bucket_size = kElems;                       // one layer ahead
  std::vector<int> order;
  for (int li = 0; li < 8; ++li) order.push_back(li);
  for (int li = 8; li-- > 0;) order.push_back(li);
  f.path->begin_step();
  for (int li : order) {
    f.path->gather(li, false, 1);
    f.path->release(li, false);
  }
  REQUIRE(f.path->end_step(1));
  const auto h2d_first = f.io.h2d_bytes;
  f.path->begin_step();
  for (int li = 0; li < 3; ++li) {  // 0 1 2 retained (due again in backward), 3 prefetched
    CHECK(f.check(li, f.path->gather(li, false, 2)) == "");
    f.path->release(li, false);
  }
  REQUIRE(f.path->live_elems() == 4 * kElems);  // the device is full
  CHECK(f.check(3, f.path->gather(3, false, 2)) == "");
  CHECK(f.path->gathered(4));        // prefetched ...
  CHECK_FALSE(f.path->gathered(0));  // ... in place of layer 0, used last in backward
  CHECK(f.path->gathered(1));
  CHECK(f.path->gathered(2));
  f.path->release(3, false);
  for (std::size_t k = 4; k < order.size(); ++k) {
    const int li = order[k];
    CHECK(f.check(li, f.path->gather(li, false, 2)) == "");
    // The layer due next is resident when this one is in use: prefetched or retained.
    if (k + 1 < order.size()) CHECK(f.path->gathered(order[k + 1]));
    f.path->release(li, false);
  }
  CHECK_FALSE(f.path->end_step(2));  // followed the trace
  CHECK(f.path->live_elems() == 0);
  CHECK(f.path->peak_live_elems() == 4 * kElems);
  // Retention still saves reads: fewer layers crossed the link than in the recording step.
  CHECK(f.io.h2d_bytes - h2d_first < h2d_first);
}

TEST_CASE("gather path: a prefetch never drops a layer due before the one it reads", "[engine][gather_path]") {
  constexpr std::size_t kElems = 64 << 10;
  Fixture f(4, nullptr, 0, 1, {}, kElems, 3 * kElems * 4 + (64 << 10));  // room for three layers
  f.cfg.zero.stage3_prefetch_bucket_size = 2 * kElems;                   // two layers ahead
  const std::vector<int> order{0, 1, 2, 3, 3, 2, 1, 0};
  f.path->begin_step();
  for (int li : order) {
    f.path->gather(li, false, 1);
    f.path->release(li, false);
  }
  REQUIRE(f.path->end_step(1));
  f.path->begin_step();
  f.path->gather(0, false, 2);  // prefetches 1 and 2: the device is full
  f.path->release(0, false);    // retained: due again last
  f.path->gather(1, false, 2);  // prefetches 3 in place of 0; then 0 (last) would need 3 or 2 to go
  CHECK(f.path->gathered(2));
  CHECK(f.path->gathered(3));
  CHECK_FALSE(f.path->gathered(0));
  f.path->release(1, false);
  for (std::size_t k = 2; k < order.size(); ++k) {
    CHECK(f.check(order[k], f.path->gather(order[k], false, 2)) == "");
    f.path->release(order[k], false);
  }
  CHECK_FALSE(f.path->end_step(2));
}

TEST_CASE("gather path: persistent layers, the live limit and misuse", "[engine][gather_path]") {
  {
    Fixture f(2, nullptr, 0, 1, {true, false});
    f.path->begin_step();
    CHECK(f.path->gather(0, false, 1) == nullptr);  // persistent: the engine's resident copy
    CHECK(f.path->in_use(0) == 1);
    f.path->release(0, false);
    CHECK(f.path->in_use(0) == 0);
    CHECK_THROWS_WITH(f.path->release(1, false), Catch::Contains("release(1) without a matching gather(1)"));
  }
  {
    Fixture f(2, nullptr, 0, 1);
    f.cfg.zero.stage3_max_live_parameters = f.lay.layers()[1].padded;  // one layer at a time
    f.path->begin_step();
    f.path->gather(0, false, 1);
    CHECK_THROWS_WITH(f.path->gather(1, false, 1),
                      Catch::Contains("gathering layer 1") && Catch::Contains("stage3_max_live_parameters"));
    f.path->release(0, false);
    CHECK(f.check(1, f.path->gather(1, false, 1)) == "");
    f.path->release(1, false);
    f.path->end_step(1);
  }
}
