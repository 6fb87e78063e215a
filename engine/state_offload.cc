// Engine::offload_states / reload_states (the protocol in engine.h): the device's bytes to
// host RAM and back through DeviceSwap (device_swap.h), over every part that holds device
// memory between steps.
#include <chrono>
#include <vector>

#include "engine/detail/engine_impl.h"
#include "engine/engine.h"
#include "runtime/core/error.h"
#include "runtime/core/log.h"
#include "runtime/core/units.h"

namespace strata::engine {

Engine::StateMove Engine::offload_states() {
  auto& I = *impl_;
  I.require_complete_setup("offload_states");
  STRATA_CHECK(!I.flags.in_step && !I.flags.in_eval, Errc::invalid_argument,
               "offload_states() inside a step or an evaluation: call it between steps");
  I.write_pending_values();
  const auto t0 = std::chrono::steady_clock::now();
  synchronize();  // this rank's background work (an asynchronous save's writer has its own copy)
  if (I.gather_path) I.gather_path->evict_all();  // gathered layers are rebuilt from the shards
  auto swap = std::make_unique<DeviceSwap>(*I.ledger, *I.dev_stream, I.nvme.get());
  try {
    std::vector<std::size_t> sizes;
    I.walk_device_memory([&](void* p, std::size_t bytes, Kind, const std::string&) {
      if (p != nullptr) sizes.push_back(bytes);
      return p;
    });
    swap->plan(sizes);  // host RAM, and what does not fit there to NVMe when an nvme_path is set
    I.walk_device_memory([&](void* p, std::size_t bytes, Kind kind, const std::string& what) {
      return swap->out(p, bytes, kind, what);
    });
    swap->finish_out();
  } catch (...) {
    // What moved comes back; the error (a host budget too small, naming the bytes) propagates.
    try {
      swap->finish_out();  // pieces written to NVMe become the store's current ones, readable back
      I.walk_device_memory([&](void* p, std::size_t bytes, Kind kind, const std::string& what) {
        return swap->back(p, bytes, kind, what);
      });
    } catch (const std::exception& e) {
      STRATA_LOG(error, "rank ", I.ranks.rank,
                 ": offload_states() failed and could not move its state back: ", e.what());
      I.offloaded = std::move(swap);  // reload_states() tries again
    }
    throw;
  }
  StateMove r{swap->bytes_out(), swap->nvme_bytes(), swap->allocations(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
  I.offloaded = std::move(swap);
  I.dev.release_cached();  // the freed memory to other users of the device
  STRATA_LOG(debug, "rank ", I.ranks.rank, ": offload_states: ", format_bytes(r.bytes), " in ", r.allocations,
             " allocations (", format_bytes(r.nvme_bytes), " of them to NVMe) in ", r.seconds, " s");
  return r;
}

Engine::StateMove Engine::reload_states() {
  auto& I = *impl_;
  I.require_setup("reload_states");
  STRATA_CHECK(I.offloaded != nullptr, Errc::invalid_argument,
               "reload_states() without offload_states(): the engine's states are on their tiers");
  const auto t0 = std::chrono::steady_clock::now();
  StateMove r{I.offloaded->bytes_out(), I.offloaded->nvme_bytes(), I.offloaded->allocations(), 0.0};
  // A device too full for it (another user of the device still holds its memory) fails here
  // naming the allocation; what came back stays, the rest stays in host RAM, and a later
  // reload_states() goes on from there.
  I.walk_device_memory([&](void* p, std::size_t bytes, Kind kind, const std::string& what) {
    return I.offloaded->back(p, bytes, kind, what);
  });
  I.offloaded.reset();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

bool Engine::states_offloaded() const noexcept { return impl_->offloaded != nullptr; }

}  // namespace strata::engine
