// MemoryLedger (see ledger.h).
#include "offload/ledger.h"

#include <sys/mman.h>

#include <algorithm>

#include "runtime/core/error.h"
#include "runtime/core/log.h"
#include "runtime/core/units.h"

namespace strata::offload {

namespace {

// Host-tier memory comes straight from the kernel and goes back to it when freed, so the
// process's resident set follows the ledger. Through malloc it did not: a buffer freed on
// another thread than the one that allocated it (update staging, freed by the I/O worker
// after its write) returned to that thread's arena, which kept the pages, and the resident
// set of tests/tools/rss_bound_test.sh grew about 6 MiB a step past the budgets.
std::size_t mapped_bytes(std::size_t bytes) { return std::max<std::size_t>(4096, (bytes + 4095) / 4096 * 4096); }
void* map_host(std::size_t bytes) {
  void* p = ::mmap(nullptr, mapped_bytes(bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  ::madvise(p, mapped_bytes(bytes), MADV_HUGEPAGE);  // fewer first-touch faults; advisory (see host_device.cc)
  return p;
}
void unmap_host(void* p, std::size_t bytes) noexcept { ::munmap(p, mapped_bytes(bytes)); }

}  // namespace

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
      unmap_host(p, e.bytes);
  }
}

void MemoryLedger::flush_cache() noexcept {
  std::vector<Cached> cached;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    cached.swap(host_cache_);
  }
  for (const auto& c : cached) hand_back(c);
}

void MemoryLedger::hand_back(const Cached& c) noexcept {
  if (c.pinned) {
    try {
      dev_.free_pinned(c.ptr);
    } catch (const std::exception& ex) {
      STRATA_LOG(error, "memory ledger: free failed: ", ex.what());
    }
  } else {
    unmap_host(c.ptr, c.bytes);
  }
  if (!pin_host_) host_budget_.release(c.bytes);
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

// Host memory, page-locked or not: a cached buffer of the same size and kind, else a new one
// (with the cache handed back first when the budget or the machine is short).
void* MemoryLedger::host_buffer(std::size_t bytes, bool pinned, std::string_view what) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = host_cache_.begin(); it != host_cache_.end(); ++it) {
      if (it->bytes != bytes || it->pinned != pinned) continue;
      void* p = it->ptr;
      host_cache_.erase(it);
      return p;  // its budget reservation comes with it
    }
  }
  if (!pin_host_) reserve_host(bytes, what);
  const auto fresh = [&]() -> void* {
    if (pinned) return dev_.allocate_pinned(bytes, what);
    void* p = map_host(bytes);
    STRATA_CHECK(p != nullptr, Errc::out_of_budget, "host tier: cannot allocate ", format_bytes(bytes), " for ", what,
                 ": the machine is out of memory");
    return p;
  };
  try {
    try {
      return fresh();
    } catch (const Error& e) {
      if (e.code() != Errc::out_of_budget) throw;
      flush_cache();
      return fresh();
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
  } else {
    p = host_buffer(bytes, lock_pages, what);
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
  if (e.tier == Tier::host) {
    // Kept for reuse; the oldest cached buffer of its kind goes when that kind fills its
    // entries (so pageable staging churning every step never evicts page-locked buffers).
    Cached evicted{ptr, e.bytes, e.pinned};
    {
      std::lock_guard<std::mutex> lock(mutex_);
      try {
        host_cache_.push_back(evicted);
        evicted.ptr = nullptr;
        const auto same = [&](const Cached& c) { return c.pinned == e.pinned; };
        if (static_cast<std::size_t>(std::count_if(host_cache_.begin(), host_cache_.end(), same)) > kCacheEntries) {
          const auto oldest = std::find_if(host_cache_.begin(), host_cache_.end(), same);
          evicted = *oldest;
          host_cache_.erase(oldest);
        }
      } catch (...) {
      }
    }
    if (evicted.ptr != nullptr) hand_back(evicted);
    return;
  }
  try {
    dev_.free(ptr);
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
