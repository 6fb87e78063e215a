// DeviceSwap (the protocol in device_swap.h).
#include "engine/device_swap.h"

#include "engine/tier_copy.h"

namespace strata::engine {

using offload::Tier;

void* DeviceSwap::out(void* p, std::size_t bytes, offload::Kind kind, const std::string& what) {
  if (p == nullptr) return p;
  void* host = ledger_.allocate(Tier::host, kind, bytes, what + " (offloaded)");
  try {
    copy_between(stream_, host, Tier::host, p, Tier::device, bytes);
    stream_.synchronize();
  } catch (...) {
    ledger_.free(host);
    throw;
  }
  ledger_.free(p);
  moved_.emplace(host, bytes);
  bytes_ += bytes;
  return host;
}

void* DeviceSwap::back(void* p, std::size_t bytes, offload::Kind kind, const std::string& what) {
  const auto it = moved_.find(p);
  if (it == moved_.end()) return p;  // never moved (a partial offload undone)
  void* dev = ledger_.allocate(Tier::device, kind, bytes, what);
  try {
    copy_between(stream_, dev, Tier::device, p, Tier::host, bytes);
    stream_.synchronize();
  } catch (...) {
    ledger_.free(dev);
    throw;
  }
  ledger_.free(p);
  moved_.erase(it);
  bytes_ -= bytes;
  return dev;
}

}  // namespace strata::engine
