// MemoryLedger (see ledger.h).
#include "offload/ledger.h"

#include <algorithm>
#include <cstdlib>

#include "runtime/core/error.h"
#include "runtime/core/log.h"
#include "runtime/core/units.h"

namespace strata::offload {

const char* kind_name(Kind k) noexcept {
  static const char* const names[] = {"params", "grads", "optimizer", "buffers"};
  return names[static_cast<int>(k)];
}

MemoryLedger::MemoryLedger(device::Device& dev, std::uint64_t host_budget_bytes, bool pin_host,
                           std::uint64_t nvme_budget_bytes, std::uint64_t device_reserved_bytes)
    : dev_(dev), pin_host_(pin_host), host_budget_("host", host_budget_bytes) {
  const std::uint64_t device_budget = dev.options().budget_bytes;
  usage_[0].budget_bytes = device_budget > device_reserved_bytes ? device_budget - device_reserved_bytes : 0;
  usage_[1].budget_bytes = pin_host ? dev.options().pinned_budget_bytes : host_budget_bytes;
  usage_[2].budget_bytes = nvme_budget_bytes ? nvme_budget_bytes : ~std::uint64_t{0} / 2;
}

void MemoryLedger::add_use(Tier tier, Kind kind, std::size_t bytes) {
  auto& u = usage_[static_cast<int>(tier)];
  u.used_bytes += bytes;
  u.peak_bytes = std::max(u.peak_bytes, u.used_bytes);
  auto k = static_cast<std::size_t>(kind);
  u.kind_used[k] += bytes;
  u.kind_peak[k] = std::max(u.kind_peak[k], u.kind_used[k]);
}

MemoryLedger::~MemoryLedger() {
  reap();
  flush_cache();
  if (!live_.empty())
    STRATA_LOG(warn, "memory ledger destroyed with ", live_.size(), " live allocations; freeing them");
  for (auto& [p, e] : live_) {
    if (e.tier == Tier::device)
      dev_.free(p);
    else if (e.pinned)
      dev_.free_pinned(p);
    else
      std::free(p);
  }
}

void MemoryLedger::flush_cache() noexcept {
  std::vector<std::pair<void*, std::size_t>> cached;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    cached.swap(pinned_cache_);
  }
  for (auto& [p, bytes] : cached) unlock(p, bytes);
}

void MemoryLedger::unlock(void* ptr, std::size_t bytes) noexcept {
  try {
    dev_.free_pinned(ptr);
  } catch (const std::exception& ex) {
    STRATA_LOG(error, "memory ledger: free failed: ", ex.what());
  }
  if (!pin_host_) host_budget_.release(bytes);
}

void MemoryLedger::reserve_host(std::size_t bytes, std::string_view what) {
  const char* hint = "Raise memory_budget.host or offload less to host RAM";
  try {
    host_budget_.reserve(bytes, what, hint);
  } catch (const Error& e) {
    if (e.code() != Errc::out_of_budget) throw;
    flush_cache();
    host_budget_.reserve(bytes, what, hint);
  }
}

// Page-locked host memory: a cached buffer of the same size, else a new one (with the
// cache handed back first when the budget is short).
void* MemoryLedger::host_pinned(std::size_t bytes, std::string_view what) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = pinned_cache_.begin(); it != pinned_cache_.end(); ++it) {
      if (it->second != bytes) continue;
      void* p = it->first;
      pinned_cache_.erase(it);
      return p;  // its budget reservation comes with it
    }
  }
  if (!pin_host_) reserve_host(bytes, what);
  try {
    try {
      return dev_.allocate_pinned(bytes, what);
    } catch (const Error& e) {
      if (e.code() != Errc::out_of_budget) throw;
      flush_cache();
      return dev_.allocate_pinned(bytes, what);
    }
  } catch (...) {
    if (!pin_host_) host_budget_.release(bytes);
    throw;
  }
}

void* MemoryLedger::allocate(Tier tier, Kind kind, std::size_t bytes, std::string_view what, bool pinned) {
  reap();
  STRATA_CHECK(tier != Tier::nvme, Errc::internal, "memory ledger: ", what, ": the NVMe tier holds files; charge() it");
  void* p = nullptr;
  const bool lock_pages = tier == Tier::host && (pin_host_ || pinned);
  if (tier == Tier::device) {
    p = dev_.allocate(bytes, what);
  } else if (lock_pages) {
    p = host_pinned(bytes, what);
  } else {
    reserve_host(bytes, what);
    p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    if (p == nullptr) {
      host_budget_.release(bytes);
      STRATA_THROW(Errc::out_of_budget, "host tier: cannot allocate ", format_bytes(bytes), " for ", what,
                   ": the machine is out of memory");
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  live_.emplace(p, Entry{tier, kind, bytes, lock_pages});
  add_use(tier, kind, bytes);
  return p;
}

bool MemoryLedger::take(void* ptr, Entry& e) noexcept {
  auto it = live_.find(ptr);
  if (it == live_.end()) {
    STRATA_LOG(error, "memory ledger: free of an unknown pointer (ignored)");
    return false;
  }
  e = it->second;
  live_.erase(it);
  auto& u = usage_[static_cast<int>(e.tier)];
  u.used_bytes -= e.bytes;
  u.kind_used[static_cast<std::size_t>(e.kind)] -= e.bytes;
  return true;
}

void MemoryLedger::release(void* ptr, const Entry& e) noexcept {
  if (e.pinned) {
    // Kept for reuse; the oldest cached buffer goes when the cache is full.
    std::pair<void*, std::size_t> evicted{nullptr, 0};
    {
      std::lock_guard<std::mutex> lock(mutex_);
      try {
        pinned_cache_.emplace_back(ptr, e.bytes);
        if (pinned_cache_.size() > kCacheEntries) {
          evicted = pinned_cache_.front();
          pinned_cache_.erase(pinned_cache_.begin());
        }
      } catch (...) {
        evicted = {ptr, e.bytes};
      }
    }
    if (evicted.first != nullptr) unlock(evicted.first, evicted.second);
    return;
  }
  try {
    if (e.tier == Tier::device)
      dev_.free(ptr);
    else {
      std::free(ptr);
      host_budget_.release(e.bytes);
    }
  } catch (const std::exception& ex) {
    STRATA_LOG(error, "memory ledger: free failed: ", ex.what());
  }
}

void MemoryLedger::free(void* ptr) noexcept {
  reap();
  if (ptr == nullptr) return;
  Entry e;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!take(ptr, e)) return;
  }
  release(ptr, e);
}

void MemoryLedger::retire(void* ptr) noexcept {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  Entry e;
  if (!take(ptr, e)) return;
  try {
    retired_.emplace_back(ptr, e);
  } catch (...) {
    STRATA_LOG(error, "memory ledger: out of memory retiring an allocation (leaked)");
  }
}

void MemoryLedger::reap() noexcept {
  std::vector<std::pair<void*, Entry>> done;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (retired_.empty()) return;
    done.swap(retired_);
  }
  for (auto& [p, e] : done) release(p, e);
}

void MemoryLedger::charge(Tier tier, Kind kind, std::size_t bytes, std::string_view what) {
  reap();
  if (tier == Tier::host) flush_cache();  // memory allocated elsewhere: the cache gives way
  STRATA_CHECK(bytes <= available(tier), Errc::out_of_budget, tier_name(tier), " tier: ", what, " needs ",
               format_bytes(bytes), " (", bytes, " B) but only ", format_bytes(available(tier)), " of its budget of ",
               format_bytes(usage(tier).budget_bytes), " is left: raise memory_budget.", tier_name(tier));
  if (tier == Tier::host && !pin_host_) reserve_host(bytes, what);
  std::lock_guard<std::mutex> lock(mutex_);
  add_use(tier, kind, bytes);
}

void MemoryLedger::discharge(Tier tier, Kind kind, std::size_t bytes) noexcept {
  if (tier == Tier::host && !pin_host_) host_budget_.release(bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  auto& u = usage_[static_cast<int>(tier)];
  u.used_bytes -= bytes;
  u.kind_used[static_cast<std::size_t>(kind)] -= bytes;
}

std::uint64_t MemoryLedger::available(Tier tier) {
  if (tier == Tier::device) reap();  // retired device memory goes back to the Device first
  std::uint64_t left;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto& u = usage_[static_cast<int>(tier)];
    left = u.budget_bytes > u.used_bytes ? u.budget_bytes - u.used_bytes : 0;
  }
  if (tier == Tier::device) {
    const auto m = dev_.memory_stats();
    left = std::min<std::uint64_t>(left, m.budget_bytes > m.used_bytes ? m.budget_bytes - m.used_bytes : 0);
  }
  return left;
}

TierUsage MemoryLedger::usage(Tier tier) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return usage_[static_cast<int>(tier)];
}

}  // namespace strata::offload
