// A Device whose memory is one block of another device's (the parent), taken when the pool
// is made. A pipeline stage puts its activations here: they are allocated and freed every
// action, and interleaved with the engine's buffers in the parent's address range they
// fragment it, so that a budget at the named minimum could fail on a buffer the free bytes
// would hold. In a pool the two never share an address range.
//
// Two ways to hand the block out. Slots: a fixed number of slots per buffer size (rounded
// to the arena's granule), each size's slots its own part of the block; an allocation takes
// a free slot of exactly its rounded size, so nothing fragments, and asking for a size with
// no free slot is refused naming it. Arena: best fit over the whole block, as the host
// device does, for buffers that are all freed between uses (then every use starts from one
// free block). Everything but memory (streams, events, pinned memory, CPU access) is the
// parent's; memory_stats() is the pool's own. Thread-safe. free_async's free runs when the
// stream gets there: drain the stream before the pool goes.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/device/arena.h"
#include "runtime/device/device.h"

namespace strata::device {

class PoolDevice final : public Device {
 public:
  // Slots: `slots[size]` buffers of each size (sizes that round alike add up). Throws
  // Errc::out_of_budget from the parent when the block does not fit; errors name `what`
  // (say there who sized the pool and from what).
  PoolDevice(Device& parent, const std::map<std::uint64_t, int>& slots, std::string what);
  // Arena: `bytes` (rounded up to the granule), best fit.
  PoolDevice(Device& parent, std::uint64_t bytes, std::string what);
  ~PoolDevice() override;

  Backend backend() const noexcept override { return parent_.backend(); }
  Device& parent() const noexcept { return parent_; }
  std::string name() const override;
  void* allocate(std::size_t bytes, std::string_view what = {}) override;
  void free(void* ptr) override;
  void* allocate_async(std::size_t bytes, Stream& stream, std::string_view what = {}) override;
  void free_async(void* ptr, Stream& stream) override;
  MemoryStats memory_stats() const override;

  void* allocate_pinned(std::size_t bytes, std::string_view what = {}) override {
    return parent_.allocate_pinned(bytes, what);
  }
  void free_pinned(void* ptr) override { parent_.free_pinned(ptr); }
  MemoryStats pinned_stats() const override { return parent_.pinned_stats(); }
  std::unique_ptr<Stream> create_stream() override { return parent_.create_stream(); }
  std::unique_ptr<Event> create_event() override { return parent_.create_event(); }
  std::unique_ptr<HostSignal> create_host_signal() override { return parent_.create_host_signal(); }
  void synchronize() override { parent_.synchronize(); }
  bool set_cpu_access(bool allow) noexcept override { return parent_.set_cpu_access(allow); }

 private:
  PoolDevice(Device& parent, std::uint64_t bytes, std::string what, const std::map<std::uint64_t, int>* slots);
  std::uint64_t offset_of(void* ptr, const char* op) const;
  Device& parent_;
  std::string what_;
  DeviceBuffer block_;
  std::unique_ptr<Arena> arena_;                                    // arena mode
  std::map<std::uint64_t, std::vector<std::uint64_t>> free_slots_;  // slot mode: size -> free offsets
  mutable std::mutex mutex_;
  std::map<std::uint64_t, std::uint64_t> live_;  // offset -> rounded size
  std::uint64_t used_ = 0, peak_ = 0;
};

}  // namespace strata::device
