// Rendezvous store and arrival check (see detail/store.h).
#include "runtime/comm/detail/store.h"

#include <chrono>
#include <filesystem>
#include <thread>

#include "runtime/core/error.h"

namespace strata::comm::detail {

RunStore open_run_store(const RendezvousConfig& c) {
  STRATA_CHECK(!c.path.empty(), Errc::invalid_argument, "rank ", c.rank, " of ", c.world_size,
               ": no rendezvous path (set STRATA_RENDEZVOUS=file:///dir or use strata launch)");
  std::error_code ec;
  std::filesystem::create_directories(c.path, ec);
  STRATA_CHECK(!ec, Errc::io, "rendezvous directory '", c.path, "' cannot be created: ", ec.message(),
               ". Point STRATA_RENDEZVOUS at a writable directory every rank can reach");
  RunStore rs;
  rs.file = std::make_unique<gloo::rendezvous::FileStore>(c.path);
  rs.store = std::make_unique<gloo::rendezvous::PrefixStore>("strata-" + c.run_id, *rs.file);
  // Arrival markers are the ranks' beacons (plain files beside the store's: Gloo's stores
  // offer no public "is this key there" check), written by rename so a reader never sees
  // half a file, and kept fresh for the failure diagnosis.
  const std::string alive = c.path + "/strata-" + c.run_id + "-alive-";
  rs.watch = std::make_unique<PeerWatch>(alive, c.rank, c.world_size);
  const auto deadline = std::chrono::steady_clock::now() + c.timeout;
  for (;;) {
    std::string missing;
    for (int r = 0; r < c.world_size; ++r) {
      if (!std::filesystem::exists(alive + std::to_string(r)))
        missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
    if (missing.empty()) return rs;
    if (std::chrono::steady_clock::now() >= deadline) {
      STRATA_THROW(Errc::timeout, "rank ", c.rank, "/", c.world_size, ": rendezvous at '", c.path, "' (run '", c.run_id,
                   "'): rank(s) ", missing, " did not arrive within ", c.timeout.count(),
                   " ms. Start every rank with the same STRATA_RENDEZVOUS and STRATA_RUN_ID (strata launch does)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace strata::comm::detail
