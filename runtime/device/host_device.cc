// The host backend: an emulated GPU for machines without one. Device memory is one
// MAP_NORESERVE region the size of the budget, carved by a best-fit Arena (pages become
// resident only when touched); pinned memory is mmap+mlock under its own budget; H2D and
// D2H copies cross a Link per direction, optionally throttled to link_gbps.
#include <sys/mman.h>

#include <cstring>
#include <mutex>
#include <set>
#include <unordered_map>

#include "runtime/core/error.h"
#include "runtime/core/log.h"
#include "runtime/core/units.h"
#include "runtime/device/arena.h"
#include "runtime/device/budget.h"
#include "runtime/device/detail/host_stream.h"
#include "runtime/device/device.h"
#include "runtime/device/pinned.h"

namespace strata::device {

std::unique_ptr<Device> create_host_device(const DeviceOptions& options);

namespace {

using detail::HostEvent;
using detail::HostSignalImpl;
using detail::HostStream;
using detail::Link;

class HostDevice final : public Device {
 public:
  explicit HostDevice(const DeviceOptions& o)
      : Device(o),
        arena_(o.budget_bytes),
        budget_("device", o.budget_bytes / Arena::kAlignment * Arena::kAlignment),
        pinned_budget_("pinned host", o.pinned_budget_bytes),
        h2d_(o.link_gbps * 1e9),
        d2h_(o.link_gbps * 1e9) {
    STRATA_CHECK(o.link_gbps >= 0, Errc::invalid_argument, "link_gbps = ", o.link_gbps,
                 " must be >= 0 (0 = unthrottled)");
    if (o.budget_bytes > 0) {
      void* p =
          mmap(nullptr, o.budget_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p == MAP_FAILED) {
        const int err = errno;
        STRATA_THROW(Errc::out_of_budget, "host device: cannot reserve a ", format_bytes(o.budget_bytes),
                     " device arena: ", errno_text(err), ". Use a smaller device budget");
      }
      base_ = static_cast<unsigned char*>(p);
      // Transparent huge pages where the kernel offers them on request (its "madvise" mode):
      // first touches fault 2 MiB at a time instead of 4 KiB. On a VM each fault is a trap,
      // and setup's first values of an 85M GPT took 6.4-7.4 s instead of 2.9 s. Advisory:
      // where it fails, only speed is lost.
      madvise(p, o.budget_bytes, MADV_HUGEPAGE);
    }
    if (o.guard_memory) guard();
  }

  // Tags the arena with a protection key that no thread may use until it asks
  // (set_cpu_access) or is this device's stream worker.
  void guard() {
    key_ = pkey_alloc(0, PKEY_DISABLE_ACCESS);
    const int err = errno;
    if (key_ < 0 ||
        (base_ != nullptr && pkey_mprotect(base_, options().budget_bytes, PROT_READ | PROT_WRITE, key_) != 0)) {
      const int err2 = key_ < 0 ? err : errno;
      if (key_ >= 0) pkey_free(key_);
      key_ = -1;
      if (base_ != nullptr) munmap(base_, options().budget_bytes);
      STRATA_THROW(Errc::unsupported,
                   "host device: guard_memory needs memory protection keys (x86 PKU with kernel "
                   "support): ",
                   errno_text(err2), ". Run without guard_memory");
    }
  }

  bool set_cpu_access(bool allow) noexcept override {
    if (key_ < 0) return true;
    const bool previous = (pkey_get(key_) & PKEY_DISABLE_ACCESS) == 0;
    pkey_set(key_, allow ? 0 : PKEY_DISABLE_ACCESS);
    return previous;
  }

  ~HostDevice() override {
    {
      std::lock_guard<std::mutex> lock(streams_mutex_);
      if (!streams_.empty()) STRATA_LOG(warn, name(), " destroyed with ", streams_.size(), " live streams");
    }
    const auto s = arena_.stats();
    if (s.live_blocks > 0) {
      STRATA_LOG(warn, name(), " destroyed with ", s.live_blocks, " device allocations (", format_bytes(s.used_bytes),
                 ") not freed");
    }
    if (!pinned_.empty()) STRATA_LOG(warn, name(), " destroyed with ", pinned_.size(), " pinned allocations not freed");
    for (auto& [ptr, a] : pinned_) pinned_unmap(a);
    if (base_ != nullptr) munmap(base_, options().budget_bytes);
    if (key_ >= 0) pkey_free(key_);
  }

  Backend backend() const noexcept override { return Backend::host; }

  std::string name() const override {
    return str_cat("host:", options().ordinal, " (emulated; ", format_bytes(options().budget_bytes), " budget",
                   options().link_gbps > 0 ? str_cat("; link ", options().link_gbps, " GB/s") : std::string(),
                   key_ >= 0 ? "; memory guarded" : "", ")");
  }

  void* allocate(std::size_t bytes, std::string_view what) override {
    const std::uint64_t size = Arena::round_up(bytes == 0 ? 1 : bytes);
    budget_.reserve(size, what);
    auto offset = arena_.allocate(size);
    if (!offset) {
      budget_.release(size);
      const auto s = arena_.stats();
      STRATA_THROW(Errc::out_of_budget, "device tier: cannot allocate ", format_bytes(size),
                   what.empty() ? "" : " for ", what, ": ", format_bytes(s.free_bytes), " free of a ",
                   format_bytes(budget_.budget_bytes()), " budget but fragmented (largest free block ",
                   format_bytes(s.largest_free_bytes), "). Free long-lived buffers first or raise the device budget");
    }
    return base_ + *offset;
  }

  void free(void* ptr) override {
    if (ptr == nullptr) return;
    budget_.release(arena_.free(offset_of(ptr, "free")));
  }

  void* allocate_async(std::size_t bytes, Stream&, std::string_view what) override {
    // Budget and address are taken now; the memory is valid for all later stream work.
    return allocate(bytes, what);
  }

  void free_async(void* ptr, Stream& stream) override {
    if (ptr == nullptr) return;
    offset_of(ptr, "free_async");  // validate now, not on the worker
    auto* host = dynamic_cast<HostStream*>(&stream);
    STRATA_CHECK(host != nullptr, Errc::invalid_argument, "free_async: stream is not a host stream");
    host->enqueue([this, ptr] { free(ptr); }, /*always=*/true);
  }

  MemoryStats memory_stats() const override {
    const auto s = arena_.stats();
    MemoryStats m;
    m.used_bytes = budget_.used_bytes();
    m.peak_bytes = budget_.peak_bytes();
    m.budget_bytes = budget_.budget_bytes();
    m.largest_free_bytes = s.largest_free_bytes;
    m.allocations = s.live_blocks;
    m.fragmentation = s.free_bytes == 0 ? 0.0 : 1.0 - static_cast<double>(s.largest_free_bytes) / s.free_bytes;
    return m;
  }

  void* allocate_pinned(std::size_t bytes, std::string_view what) override {
    pinned_budget_.reserve(bytes, what, "Raise the pinned host budget or use fewer/smaller buffers");
    PinnedAllocation a;
    try {
      a = pinned_map(bytes);
    } catch (...) {
      pinned_budget_.release(bytes);
      throw;
    }
    std::lock_guard<std::mutex> lock(pinned_mutex_);
    pinned_.emplace(a.ptr, a);
    pinned_asked_.emplace(a.ptr, bytes);
    return a.ptr;
  }

  void free_pinned(void* ptr) override {
    if (ptr == nullptr) return;
    PinnedAllocation a;
    std::size_t asked;
    {
      std::lock_guard<std::mutex> lock(pinned_mutex_);
      auto it = pinned_.find(ptr);
      STRATA_CHECK(it != pinned_.end(), Errc::internal,
                   "free_pinned of a pointer that is not a live pinned allocation");
      a = it->second;
      pinned_.erase(it);
      asked = pinned_asked_.at(ptr);
      pinned_asked_.erase(ptr);
    }
    pinned_unmap(a);
    pinned_budget_.release(asked);
  }

  MemoryStats pinned_stats() const override {
    MemoryStats m;
    m.used_bytes = pinned_budget_.used_bytes();
    m.peak_bytes = pinned_budget_.peak_bytes();
    m.budget_bytes = pinned_budget_.budget_bytes();
    m.largest_free_bytes = m.budget_bytes - m.used_bytes;
    std::lock_guard<std::mutex> lock(pinned_mutex_);
    m.allocations = pinned_.size();
    return m;
  }

  std::unique_ptr<Stream> create_stream() override {
    auto s = std::make_unique<HostStream>(
        h2d_, d2h_,
        [this](HostStream* gone) {
          std::lock_guard<std::mutex> lock(streams_mutex_);
          streams_.erase(gone);
        },
        key_);
    std::lock_guard<std::mutex> lock(streams_mutex_);
    streams_.insert(s.get());
    return s;
  }

  std::unique_ptr<Event> create_event() override { return std::make_unique<HostEvent>(); }
  std::unique_ptr<HostSignal> create_host_signal() override { return std::make_unique<HostSignalImpl>(); }

  void synchronize() override {
    std::lock_guard<std::mutex> lock(streams_mutex_);
    for (HostStream* s : streams_) s->synchronize();
  }

 private:
  std::uint64_t offset_of(void* ptr, const char* op) const {
    auto* p = static_cast<unsigned char*>(ptr);
    STRATA_CHECK(base_ != nullptr && p >= base_ && p < base_ + options().budget_bytes, Errc::invalid_argument, op,
                 ": pointer ", ptr, " is not device memory of ", name());
    return static_cast<std::uint64_t>(p - base_);
  }

  unsigned char* base_ = nullptr;
  int key_ = -1;  // guard_memory: the arena's protection key
  Arena arena_;
  Budget budget_;
  Budget pinned_budget_;
  Link h2d_;
  Link d2h_;
  mutable std::mutex pinned_mutex_;
  std::unordered_map<void*, PinnedAllocation> pinned_;
  std::unordered_map<void*, std::size_t> pinned_asked_;
  std::mutex streams_mutex_;
  std::set<HostStream*> streams_;
};

}  // namespace

std::unique_ptr<Device> create_host_device(const DeviceOptions& options) {
  return std::make_unique<HostDevice>(options);
}

}  // namespace strata::device
