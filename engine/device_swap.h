// DeviceSwap: what Engine::offload_states() moves off the device and reload_states() brings
// back (docs/design.md, "The engine's parts"). The parts that hold device memory between
// steps (ParamHomes, OptimizerState, GradReducer) name each allocation through their
// device_memory(fn), and assign what fn returns: out() copies a device allocation into a new
// host-tier one of the same kind through the ledger (which refuses what the host budget
// cannot hold) and frees it on the device; back() does the reverse for a pointer out() gave
// and passes any other through, so the same walk undoes a partial offload. The bytes are
// copied, not recomputed: a reload gives every bit back.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>

#include "offload/ledger.h"
#include "runtime/device/device.h"

namespace strata::engine {

class DeviceSwap {
 public:
  // fn(device or host pointer, bytes, kind, what) -> the pointer the part keeps.
  using Fn = std::function<void*(void* p, std::size_t bytes, offload::Kind kind, const std::string& what)>;

  DeviceSwap(offload::MemoryLedger& ledger, device::Stream& stream) : ledger_(ledger), stream_(stream) {}
  void* out(void* p, std::size_t bytes, offload::Kind kind, const std::string& what);
  void* back(void* p, std::size_t bytes, offload::Kind kind, const std::string& what);
  std::uint64_t bytes_out() const noexcept { return bytes_; }  // off the device now
  std::size_t allocations() const noexcept { return moved_.size(); }

 private:
  offload::MemoryLedger& ledger_;
  device::Stream& stream_;
  std::unordered_map<void*, std::size_t> moved_;  // host copy -> bytes
  std::uint64_t bytes_ = 0;
};

}  // namespace strata::engine
