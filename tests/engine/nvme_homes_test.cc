// NvmeHomes (engine/nvme_homes.h), the engine's NVMe tier on its own: the parameter store
// holds only the layers placed on NVMe, its buffers and files are charged to the host and
// NVMe tiers; a migration's second store is charged while both exist and the first one's
// charges go when it is adopted (or the second's when it is dropped); a second owner of the
// same rank directory is refused while the first lives; everything is given back at the end.
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
    CHECK(homes.params() == nullptr);
    CHECK(homes.io() == nullptr);
    homes.open_params({Tier::nvme, Tier::host});
    REQUIRE(homes.params() != nullptr);
    CHECK(homes.io() != nullptr);
    CHECK(homes.store_index(0) == 0);
    CHECK(homes.store_index(1) == -1);
    CHECK(homes.params_subdir() == "params");
    const std::uint64_t files_a = ledger.usage(Tier::nvme).used_bytes;
    const std::uint64_t host_a = ledger.usage(Tier::host).used_bytes;
    CHECK(files_a == homes.params()->file_bytes());
    CHECK(host_a > 0);

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
    CHECK(homes.store_index(1) == 1);
    CHECK(homes.params_subdir() == "params.1");
    CHECK(ledger.usage(Tier::nvme).used_bytes == files_b);
  }
  CHECK(ledger.usage(Tier::nvme).used_bytes == 0);
  CHECK(ledger.usage(Tier::host).used_bytes == 0);
}
