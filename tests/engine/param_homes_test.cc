// ParamHomes (engine/param_homes.h), where each layer's parameters live, on its own: stage-3
// shards written once keep their bytes through migrations host -> NVMe and device, and back
// (a new parameter store built, filled and adopted; the old homes freed), every tier's use
// follows; a persistent layer's resident copy is rebuilt from its shards by refresh().
#include <algorithm>
#include <cstring>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/param_homes.h"
#include "tests/engine/engine_support.h"
#include "tests/support/temp_dir.h"

using namespace strata;
using namespace strata::engine;

namespace {

std::vector<float> values(std::size_t n, float base) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = base + static_cast<float>(i);
  return v;
}

// This rank's shards of layer li, wherever they live.
std::vector<float> read_shards(ParamHomes& h, const ShardMap& map, NvmeHomes& nvme, device::Stream& s,
                               const Layout& lay, int li) {
  std::vector<float> out(lay.layer_shard(li));
  const std::size_t bytes = out.size() * 4;
  if (map.param_tier(li) == Tier::nvme) {
    nvme.read_params(li, [&](std::uint64_t off, const void* d, std::uint64_t n) {
      std::memcpy(reinterpret_cast<char*>(out.data()) + off, d, n);
    });
  } else if (map.param_tier(li) == Tier::device) {
    s.copy_async(out.data(), h.shard(li), bytes, device::CopyKind::device_to_host);
    s.synchronize();
  } else {
    std::memcpy(out.data(), h.shard(li), bytes);
  }
  return out;
}

// What the placement does after a migration: each layer is recorded on its new tier but those
// that stayed.
void record(ShardMap& map, const std::vector<Tier>& to, const std::vector<int>& stayed) {
  for (int li = 0; li < static_cast<int>(to.size()); ++li) {
    if (std::find(stayed.begin(), stayed.end(), li) == stayed.end())
      map.move_params(li, to[static_cast<std::size_t>(li)]);
  }
}

}  // namespace

TEST_CASE("param homes: shards keep their bytes through migrations to and from NVMe", "[offload][param_homes]") {
  std::vector<ParamSpec> specs(2);
  specs[0].name = "a", specs[0].shape = {300}, specs[0].layer = 0;
  specs[1].name = "b", specs[1].shape = {200}, specs[1].layer = 1;
  const Layout lay(specs, 1, 1024);
  auto dev = test::host_device(16 << 20, 16 << 20);
  auto stream = dev->create_stream();
  MemoryLedger ledger(*dev, 64 << 20, false);
  test::TempDir dir("strata-homes");
  EngineConfig cfg;
  cfg.zero.stage = 3;
  cfg.offload_param.nvme_path = dir.path();
  IoStats io;
  NvmeHomes nvme({cfg, lay, 0, 4, *dev, ledger, nullptr});
  ShardMap map({/*persistent=*/true, false});
  const auto migrate = [&](ParamHomes& homes, const std::vector<Tier>& to) {
    const std::vector<int> stayed = homes.migrate(to);
    record(map, to, stayed);
    return stayed;
  };
  for (int li = 0; li < 2; ++li) map.place(li, Tier::device, Tier::host);
  {
    ParamHomes homes({lay, 3, 0, 1, DType::fp32, *stream, ledger, nvme, map, nullptr, nullptr, io});
    const auto a = values(lay.layer_shard(0), 0.5f), b = values(lay.layer_shard(1), 1000.5f);
    const auto a_full = values(lay.layers()[0].padded, 0.5f);
    homes.add_layer(0);
    homes.add_layer(1);
    CHECK(homes.full(0) != nullptr);
    CHECK(homes.full(1) == nullptr);
    homes.write(0, a_full.data(), a.data());
    homes.write(1, nullptr, b.data());
    const std::uint64_t host_shards = (a.size() + b.size()) * 4;
    CHECK(ledger.usage(Tier::host).kind_used[static_cast<int>(Kind::params)] == host_shards);

    const auto device_params = [&] { return ledger.usage(Tier::device).kind_used[static_cast<int>(Kind::params)]; };
    const std::uint64_t resident = device_params();  // layer 0's resident copy
    CHECK(migrate(homes, {Tier::nvme, Tier::device}).empty());
    CHECK(homes.shard(0) == nullptr);
    CHECK(device_params() >= resident + b.size() * 4);  // layer 1's shards
    CHECK(read_shards(homes, map, nvme, *stream, lay, 0) == a);
    CHECK(read_shards(homes, map, nvme, *stream, lay, 1) == b);
    CHECK(ledger.usage(Tier::host).kind_used[static_cast<int>(Kind::params)] == 0);
    CHECK(io.nvme_write_bytes == a.size() * 4);

    CHECK(migrate(homes, {Tier::host, Tier::host}).empty());
    CHECK(read_shards(homes, map, nvme, *stream, lay, 0) == a);
    CHECK(read_shards(homes, map, nvme, *stream, lay, 1) == b);
    CHECK(ledger.usage(Tier::host).kind_used[static_cast<int>(Kind::params)] == host_shards);

    // The resident copy of the persistent layer, spoiled, comes back from its shards.
    std::vector<float> junk(lay.layers()[0].padded, -1.0f);
    stream->copy_async(homes.full(0), junk.data(), junk.size() * 4, device::CopyKind::host_to_device);
    homes.refresh();
    std::vector<float> back(lay.layers()[0].padded);
    stream->copy_async(back.data(), homes.full(0), back.size() * 4, device::CopyKind::device_to_host);
    stream->synchronize();
    CHECK(std::vector<float>(back.begin(), back.begin() + static_cast<long>(a.size())) == a);
  }
  CHECK(ledger.usage(Tier::device).used_bytes == 0);
  CHECK(ledger.usage(Tier::host).kind_used[static_cast<int>(Kind::params)] == 0);
}

TEST_CASE("param homes: a layer whose shards do not fit on the new tier stays where it was", "[param_homes]") {
  std::vector<ParamSpec> specs(2);
  specs[0].name = "a", specs[0].shape = {300}, specs[0].layer = 0;
  specs[1].name = "b", specs[1].shape = {200}, specs[1].layer = 1;
  const Layout lay(specs, 1, 1024);
  // Room on the device for layer b's shards (800 B), not for layer a's (1200 B) as well.
  auto dev = test::host_device(1024, 16 << 20);
  auto stream = dev->create_stream();
  MemoryLedger ledger(*dev, 64 << 20, false);
  EngineConfig cfg;
  cfg.zero.stage = 3;
  IoStats io;
  NvmeHomes nvme({cfg, lay, 0, 4, *dev, ledger, nullptr});
  ShardMap map({false, false});
  for (int li = 0; li < 2; ++li) map.place(li, Tier::device, Tier::host);
  {
    ParamHomes homes({lay, 3, 0, 1, DType::fp32, *stream, ledger, nvme, map, nullptr, nullptr, io});
    const auto a = values(lay.layer_shard(0), 0.5f), b = values(lay.layer_shard(1), 1000.5f);
    homes.add_layer(0);
    homes.add_layer(1);
    homes.write(0, nullptr, a.data());
    homes.write(1, nullptr, b.data());
    const std::vector<Tier> to{Tier::device, Tier::device};
    const std::vector<int> stayed = homes.migrate(to);
    CHECK(stayed == std::vector<int>{0});
    record(map, to, stayed);
    CHECK(map.param_tier(0) == Tier::host);
    CHECK(map.param_tier(1) == Tier::device);
    // Each layer's shards are where the map says, with their bytes.
    CHECK(read_shards(homes, map, nvme, *stream, lay, 0) == a);
    CHECK(read_shards(homes, map, nvme, *stream, lay, 1) == b);
    CHECK(ledger.usage(Tier::host).kind_used[static_cast<int>(Kind::params)] == a.size() * 4);
    const std::vector<Tier> back{Tier::host, Tier::host};
    CHECK(homes.migrate(back).empty());
    record(map, back, {});
    CHECK(read_shards(homes, map, nvme, *stream, lay, 0) == a);
    CHECK(read_shards(homes, map, nvme, *stream, lay, 1) == b);
  }
  CHECK(ledger.usage(Tier::device).used_bytes == 0);
}
