// UpdateStaging (engine/update_staging.h) on its own, on the host device: for each home of a
// layer's parameters and side of its optimizer, the target the optimizer writes to is the
// one the protocol names (the parameters themselves, host staging, or a device buffer), and
// what is written there ends up, byte for byte, where the parameters live: a device replica
// (H2D once the layer is complete), host shards (from the device buffer), or the NVMe
// parameter store (a write-back on its queue); drop() gives every buffer back. A slow
// NVMe paces the write-backs of layers whose optimizer state is on NVMe too, so the staging
// held stays at the two layers the estimate counts.
#include <chrono>
#include <cstring>
#include <future>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/update_staging.h"
#include "tests/engine/engine_support.h"
#include "tests/support/temp_dir.h"

using namespace strata;
using namespace strata::engine;

namespace {

struct Fixture {
  Layout lay;
  std::unique_ptr<device::Device> dev = test::host_device(8 << 20, 8 << 20);
  std::unique_ptr<device::Stream> stream = dev->create_stream();
  MemoryLedger ledger{*dev, 64 << 20, false};
  test::TempDir dir{"strata-updates"};
  EngineConfig cfg;
  IoStats io;
  std::unique_ptr<NvmeHomes> nvme;
  // Every layer's home, set before make(): its copies and, recorded in the shard map, its tiers.
  struct Home {
    void* full = nullptr;
    void* shard = nullptr;
    Tier param_tier = Tier::device;
    Tier opt_tier = Tier::device;
  } home;
  ShardMap map;

  explicit Fixture(int stage, int layers = 1)
      : lay(specs(layers), 1, 64), map(std::vector<bool>(static_cast<std::size_t>(layers), false)) {
    cfg.zero.stage = stage;
    cfg.offload_param.nvme_path = dir.path();
    nvme = std::make_unique<NvmeHomes>(NvmeHomes::Context{cfg, lay, 0, 4, *dev, ledger, nullptr});
  }
  static std::vector<ParamSpec> specs(int layers) {
    std::vector<ParamSpec> out;
    for (int l = 0; l < layers; ++l) {
      ParamSpec w;
      w.name = "layer" + std::to_string(l) + ".weight";
      w.shape = {150};
      w.layer = l;
      out.push_back(w);
    }
    return out;
  }
  UpdateStaging make() {
    for (std::size_t li = 0; li < map.size(); ++li) map.place(static_cast<int>(li), home.opt_tier, home.param_tier);
    const auto copies = [this](int) { return UpdateStaging::Copies{home.full, home.shard}; };
    return UpdateStaging({lay, cfg.zero.stage, 0, DType::fp32, *dev, *stream, ledger, *nvme, io, nullptr, map, copies});
  }
  // What the optimizer would write for every bucket: element i of the layer = i + 0.5.
  void write_all(UpdateStaging& u, bool expect_staged, int li = 0) { CHECK(write_layer(u, expect_staged, li)); }
  // Returns whether every target was staged as expected; no Catch assertion (threads call it).
  bool write_layer(UpdateStaging& u, bool expect_staged, int li) {
    bool as_expected = true;
    const auto& L = lay.layers()[li];
    for (std::size_t k = 0; k < L.buckets.size(); ++k) {
      const auto& b = lay.buckets()[L.buckets[k]];
      const auto t = u.target(li, k, 0);
      as_expected = as_expected && t.staged == expect_staged;
      std::vector<float> v(b.shard);
      for (std::size_t j = 0; j < b.shard; ++j) v[j] = static_cast<float>(b.flat_offset - L.flat_offset + j) + 0.5f;
      if (home.opt_tier == Tier::device) {
        stream->copy_async(t.copy, v.data(), v.size() * 4, device::CopyKind::host_to_device);
        stream->synchronize();
      } else {
        std::memcpy(t.copy, v.data(), v.size() * 4);
      }
      if (t.staged) u.written(li, b.shard);
    }
    return as_expected;
  }
  bool holds_layer(const void* p) const {
    const std::size_t n = lay.layers()[0].padded;
    std::vector<float> got(n);
    std::memcpy(got.data(), p, n * 4);
    for (std::size_t i = 0; i < n; ++i)
      if (got[i] != static_cast<float>(i) + 0.5f) return false;
    return true;
  }
};

}  // namespace

TEST_CASE("update staging: device replica updated by the CPU optimizer goes through host staging",
          "[engine][update_staging]") {
  Fixture f(1);
  const std::size_t bytes = f.lay.layers()[0].padded * 4;
  f.home = {f.ledger.allocate(Tier::device, Kind::params, bytes, "replica"), nullptr, Tier::device, Tier::host};
  {
    auto u = f.make();
    f.write_all(u, true);
    CHECK(f.holds_layer(f.home.full));
    CHECK(f.io.h2d_bytes == bytes);
  }
  f.ledger.free(f.home.full);
  CHECK(f.ledger.usage(Tier::host).used_bytes == 0);
}

TEST_CASE("update staging: the device optimizer of host shards writes a device buffer, flushed to them",
          "[engine][update_staging]") {
  Fixture f(3);
  const std::size_t bytes = f.lay.layer_shard(0) * 4;
  f.home = {nullptr, f.ledger.allocate(Tier::host, Kind::params, bytes, "shards"), Tier::host, Tier::device};
  {
    auto u = f.make();
    f.write_all(u, false);
    CHECK(f.ledger.usage(Tier::device).used_bytes == bytes);  // the device buffer
    u.flush_device(0);
    CHECK(f.ledger.usage(Tier::device).used_bytes == 0);
    CHECK(f.holds_layer(f.home.shard));
    CHECK(f.io.d2h_bytes == bytes);
  }
  f.ledger.free(f.home.shard);
}

TEST_CASE("update staging: NVMe shards are written back on the store's queue; drop() frees a half step",
          "[engine][update_staging]") {
  Fixture f(3);
  f.nvme->open_params({Tier::nvme});
  f.home = {nullptr, nullptr, Tier::nvme, Tier::host};
  const std::uint64_t host_before = f.ledger.usage(Tier::host).used_bytes;
  {
    auto u = f.make();
    f.write_all(u, true);
    f.nvme->drain();
    f.nvme->commit_params();
    std::vector<float> back(f.lay.layer_shard(0));
    f.nvme->read_params(0, [&](std::uint64_t off, const void* data, std::uint64_t n) {
      std::memcpy(reinterpret_cast<char*>(back.data()) + off, data, n);
    });
    CHECK(f.holds_layer(back.data()));
    CHECK(f.io.nvme_write_bytes == back.size() * 4);
    f.ledger.reap();
    CHECK(f.ledger.usage(Tier::host).used_bytes == host_before);  // the staging went back
    // A step that fails halfway: the staging of a layer not yet complete is dropped.
    const auto t = u.target(0, 0, 0);
    CHECK(t.staged);
    CHECK(f.ledger.usage(Tier::host).used_bytes > host_before);
    u.drop();
    CHECK(f.ledger.usage(Tier::host).used_bytes == host_before);
  }
}

// The parameter store is held by a blocking read that waits for the test's word, as a starved
// or slow NVMe holds it (its queued requests wait for it); the optimizer meanwhile completes three layers of NVMe
// shards. With the optimizer state on NVMe (paced) the second layer's write-back waits for the first's, so the third
// layer's staging is taken only after the first's went back: at most two layers' staging is ever held (the bound the
// estimate counts). With the state in host RAM the optimizer runs ahead and holds all three until the store catches up.
TEST_CASE("update staging: write-backs of NVMe-state layers are paced by a slow NVMe", "[engine][update_staging]") {
  const bool paced = GENERATE(true, false);
  CAPTURE(paced);
  Fixture f(3, 3);
  f.nvme->open_params({Tier::nvme, Tier::nvme, Tier::nvme});
  f.home = {nullptr, nullptr, Tier::nvme, paced ? Tier::nvme : Tier::host};
  const std::uint64_t staging = f.lay.layer_shard(0) * 4;
  f.ledger.reap();
  const std::uint64_t base = f.ledger.usage(Tier::host).used_bytes;
  REQUIRE(f.ledger.usage(Tier::host).peak_bytes <= base + staging);
  std::promise<void> go;
  std::shared_future<void> released = go.get_future().share();
  // Layer 0 first gets shards the read can verify (a new store's files hold none yet).
  const std::vector<char> zeros(staging, 0);
  f.nvme->write_params(0, zeros.data());
  f.nvme->commit_params();
  std::promise<void> entered;
  auto slow = std::async(std::launch::async, [&] {
    bool first = true;
    try {
      f.nvme->read_params(0, [&](std::uint64_t, const void*, std::uint64_t) {
        if (!std::exchange(first, false)) return;
        entered.set_value();
        released.wait();
      });
    } catch (...) {
      if (first) entered.set_exception(std::current_exception());
      throw;
    }
  });
  entered.get_future().get();
  {
    auto u = f.make();
    auto optimizer = std::async(std::launch::async, [&] {
      bool staged = true;
      for (int li = 0; li < 3; ++li) staged = f.write_layer(u, true, li) && staged;
      return staged;
    });
    if (paced) {
      // Layer 1's write-back queued, it waits for layer 0's; let it sit there a while.
      CHECK(optimizer.wait_for(std::chrono::milliseconds(300)) == std::future_status::timeout);
    } else {
      CHECK(optimizer.wait_for(std::chrono::seconds(30)) == std::future_status::ready);
    }
    go.set_value();
    slow.get();
    CHECK(optimizer.get());
    f.nvme->drain();
  }
  f.ledger.reap();
  const std::uint64_t peak = f.ledger.usage(Tier::host).peak_bytes - base;
  CHECK(peak == (paced ? 2 : 3) * staging);
  CHECK(f.ledger.usage(Tier::host).used_bytes == base);
}
