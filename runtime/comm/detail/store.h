// The rendezvous store both backends use: Gloo's FileStore under a per-run prefix, plus
// the "every rank arrived" check that turns a missing rank into an error naming it, and the
// beacons that name a peer that died or went silent later.
#pragma once

#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>

#include <memory>

#include "runtime/comm/communicator.h"
#include "runtime/comm/detail/peer_watch.h"

namespace strata::comm::detail {

struct RunStore {
  std::unique_ptr<gloo::rendezvous::FileStore> file;
  std::unique_ptr<gloo::rendezvous::PrefixStore> store;
  std::unique_ptr<PeerWatch> watch;  // this rank's beacon and the peers' diagnosis
};

// Opens the store for cfg (creating the directory) and waits until every rank announced
// itself, or throws Errc::timeout listing the ranks that did not.
RunStore open_run_store(const RendezvousConfig& cfg);

}  // namespace strata::comm::detail
