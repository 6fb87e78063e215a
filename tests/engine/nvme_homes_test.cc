// NvmeHomes (engine/nvme_homes.h), the engine's NVMe tier on its own: the parameter store
// holds only the layers placed on NVMe, its buffers and files are charged to the host and
// NVMe tiers; a migration's second store is charged while both exist and the first one's
// charges go when it is adopted (or the second's when it is dropped); a second owner of the
// same rank directory is refused while the first lives; requests queue by layer, and one of a
// store that is gone counts as completed; everything is given back at the end.
#include <cstring>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/nvme_homes.h"
#include "tests/support/temp_dir.h"

using namespace strata;
using namespace strata::engine;

TEST_CASE("nvme homes: stores are charged, adopted and dropped; the directory has one owner", "[offload][nvme_homes]") {
  std::vector<ParamSpec> specs(2);
  specs[0].name = "a", specs[0].shape = {300}, specs[0].layer = 0;
  specs[1].name = "b", specs[1].shape = {500}, specs[1].layer = 1;
  const Layout lay(specs, 1, 1024);
  device::DeviceOptions o;
  auto dev = device::Device::create(o);
  MemoryLedger ledger(*dev, 256 << 20, false);
  test::TempDir dir("strata-nvmehomes");
  EngineConfig cfg;
  cfg.zero.stage = 3;
  cfg.offload_param.nvme_path = dir.path();
  cfg.offload_param.buffer_count = 2;
  cfg.offload_param.buffer_size = 4096;
  const NvmeHomes::Context c{cfg, lay, 0, 2, *dev, ledger, nullptr};
  {
    NvmeHomes homes(c);
    CHECK(!homes.has_params());
    homes.open_params({Tier::nvme, Tier::host});
    REQUIRE(homes.has_params());
    CHECK(homes.store_index(0) == 0);
    CHECK(homes.store_index(1) == -1);
    CHECK(homes.params_subdir() == "params");
    const std::uint64_t files_a = ledger.usage(Tier::nvme).used_bytes;
    const std::uint64_t host_a = ledger.usage(Tier::host).used_bytes;
    CHECK(host_a > 0);
    {  // the charge is the store's files: a second store of the same layers has as many bytes
      auto probe = homes.build_params({Tier::nvme, Tier::host}, "params.probe");
      CHECK(files_a == probe.store->file_bytes());
      homes.drop(probe);
    }

    // Requests by layer: a queued write-back hands its staging back to the ledger, the commit
    // queued behind it makes it current, and a blocking read sees it.
    const std::size_t shard = lay.layer_shard(0) * 2;
    auto* staging = static_cast<char*>(ledger.allocate(Tier::host, Kind::buffers, shard, "test staging"));
    for (std::size_t i = 0; i < shard; ++i) staging[i] = static_cast<char>(i * 7 + 1);
    const std::vector<char> expect(staging, staging + shard);
    const auto written = homes.write_params_async(0, staging);
    homes.commit_params_async(0);
    std::vector<char> back(shard);
    homes.read_params(0,
                      [&](std::uint64_t off, const void* d, std::uint64_t n) { std::memcpy(back.data() + off, d, n); });
    CHECK(back == expect);
    CHECK(homes.succeeded(written));
    ledger.reap();
    CHECK(ledger.usage(Tier::host).used_bytes == host_a);

    {  // a second engine on the same rank directory
      NvmeHomes other(c);
      CHECK_THROWS_WITH(other.open_params({Tier::nvme, Tier::nvme}), Catch::Contains("is in use"));
    }

    auto both = homes.build_params({Tier::nvme, Tier::nvme}, "params.1");
    CHECK(ledger.usage(Tier::nvme).used_bytes == files_a + both.store->file_bytes());
    homes.drop(both);  // a failed migration leaves the first store and its charges alone
    CHECK(ledger.usage(Tier::nvme).used_bytes == files_a);
    CHECK(ledger.usage(Tier::host).used_bytes == host_a);

    auto moved = homes.build_params({Tier::nvme, Tier::nvme}, "params.1");
    const std::uint64_t files_b = moved.store->file_bytes();
    homes.adopt(std::move(moved));
    homes.wait(written);  // a request of a store that is gone has completed
    CHECK(homes.succeeded(written));
    CHECK(homes.store_index(1) == 1);
    CHECK(homes.params_subdir() == "params.1");
    CHECK(ledger.usage(Tier::nvme).used_bytes == files_b);
  }
  CHECK(ledger.usage(Tier::nvme).used_bytes == 0);
  CHECK(ledger.usage(Tier::host).used_bytes == 0);
}
