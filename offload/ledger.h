// The memory ledger of one rank's model state: every byte of model state is allocated through it, on a tier
// (device, host) and as a kind (params, grads, optimizer state, buffers), or, for the NVMe
// tier and memory that io/ allocates itself, charged to it; so per-tier and per-kind use
// and peaks are known at any time and every tier's hard budget holds (the device tier's
// through the Device, the host tier's through a Budget here, the NVMe tier's here: its
// bytes are the swap files, both generations, reserved when they are created).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "offload/tier.h"
#include "runtime/device/budget.h"
#include "runtime/device/device.h"

namespace strata::offload {

enum class Kind { params = 0, grads = 1, optimizer = 2, buffers = 3 };
inline constexpr int kKinds = 4;
const char* kind_name(Kind k) noexcept;

struct TierUsage {
  std::uint64_t used_bytes = 0, peak_bytes = 0, budget_bytes = 0;
  std::array<std::uint64_t, kKinds> kind_used{}, kind_peak{};
};

class MemoryLedger {
 public:
  // Host-tier memory is pinned through `dev` when pin_host (its pinned budget applies),
  // else page-aligned pageable memory under host_budget_bytes.
  // nvme_budget_bytes 0: no limit but the file system's. device_reserved_bytes: device memory
  // kept for others beyond what they hold now (a trainer's buffers allocated during steps):
  // the device tier's budget is the Device's less these.
  MemoryLedger(device::Device& dev, std::uint64_t host_budget_bytes, bool pin_host, std::uint64_t nvme_budget_bytes = 0,
               std::uint64_t device_reserved_bytes = 0);
  ~MemoryLedger();
  MemoryLedger(const MemoryLedger&) = delete;
  MemoryLedger& operator=(const MemoryLedger&) = delete;

  // pinned: a host-tier buffer that a stream copy reads after stream work filled it (a CUDA
  // copy from pageable memory may read it when it is queued, not when the stream gets
  // there), page-locked whatever pin_host says. Pageable host memory is mapped from the
  // kernel and unmapped when handed back, never malloc's, so the process's resident set
  // follows the ledger. Freed host buffers are kept for reuse by the next request of the
  // same size and kind (locking pages is slow and cudaFreeHost waits for the whole device;
  // a fresh mapping is zeroed page by page); they keep their place in the tier's Budget, are
  // not counted in its use, and are handed back whenever a host allocation or charge would
  // not fit.
  void* allocate(Tier tier, Kind kind, std::size_t bytes, std::string_view what, bool pinned = false);
  void free(void* ptr) noexcept;
  // free() for stream work (a host function on a CUDA stream must not call CUDA): the bytes
  // leave the tier's use now; the memory goes back to the Device at the next allocate(),
  // free() or reap() on the owner's thread.
  void retire(void* ptr) noexcept;
  void reap() noexcept;
  // Bytes allocated outside the ledger (the NVMe swapper's pinned buffer pool, swap files on
  // the NVMe tier), counted in a tier's use and held against its budget like the ledger's
  // own allocations. A refusal names the tier, the bytes and the budget key.
  void charge(Tier tier, Kind kind, std::size_t bytes, std::string_view what);
  void discharge(Tier tier, Kind kind, std::size_t bytes) noexcept;
  // Budget left. The device tier's also counts what others hold on the Device (a trainer's
  // activations): the smaller of the ledger's and the Device's view.
  std::uint64_t available(Tier tier);
  TierUsage usage(Tier tier) const;
  device::Device& device() noexcept { return dev_; }
  // Whether every host-tier buffer is page-locked (pin_host): a stream copy from one reads it
  // when the stream gets there.
  bool pins_host() const noexcept { return pin_host_; }

 private:
  struct Entry {
    Tier tier;
    Kind kind;
    std::size_t bytes;
    bool pinned = false;  // page-locked host memory (pin_host, or asked for)
  };
  struct Cached {  // a freed host buffer kept for reuse
    void* ptr;
    std::size_t bytes;  // as asked
    bool pinned;
  };
  void* host_buffer(std::size_t bytes, bool pinned, std::string_view what);
  void reserve_host(std::size_t bytes, std::string_view what);  // host_budget_, flushing the cache if short
  void flush_cache() noexcept;
  void hand_back(const Cached& c) noexcept;               // to the Device or the kernel, and the budget
  void add_use(Tier tier, Kind kind, std::size_t bytes);  // mutex_ held
  bool take(void* ptr, Entry& e) noexcept;                // mutex_ held: unregisters ptr
  void release(void* ptr, const Entry& e) noexcept;       // hands the memory back

  device::Device& dev_;
  bool pin_host_;
  device::Budget host_budget_;
  mutable std::mutex mutex_;
  std::unordered_map<void*, Entry> live_;
  std::vector<std::pair<void*, Entry>> retired_;
  std::vector<Cached> host_cache_;
  static constexpr std::size_t kCacheEntries = 16;  // of each kind (page-locked, pageable)
  std::array<TierUsage, kTiers> usage_{};
};

}  // namespace strata::offload
