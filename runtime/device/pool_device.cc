// A device over one block of another's memory (see pool_device.h).
#include "runtime/device/pool_device.h"

#include <algorithm>

#include "runtime/core/error.h"
#include "runtime/core/log.h"
#include "runtime/core/units.h"

namespace strata::device {
namespace {

std::uint64_t slot_bytes(const std::map<std::uint64_t, int>& slots) {
  std::uint64_t sum = 0;
  for (const auto& [size, count] : slots) sum += Arena::round_up(size) * static_cast<std::uint64_t>(std::max(0, count));
  return sum;
}

DeviceOptions pool_options(const Device& parent, std::uint64_t bytes) {
  DeviceOptions o = parent.options();
  o.budget_bytes = Arena::round_up(bytes);
  return o;
}

}  // namespace

PoolDevice::PoolDevice(Device& parent, std::uint64_t bytes, std::string what, const std::map<std::uint64_t, int>* slots)
    : Device(pool_options(parent, bytes)),
      parent_(parent),
      what_(std::move(what)),
      block_(parent, std::max<std::uint64_t>(Arena::round_up(bytes), 1), what_) {
  if (slots == nullptr) {
    arena_ = std::make_unique<Arena>(Arena::round_up(bytes));
    return;
  }
  std::map<std::uint64_t, int> rounded;  // sizes that round alike share their slots
  for (const auto& [size, count] : *slots) rounded[Arena::round_up(size)] += std::max(0, count);
  std::uint64_t at = 0;
  for (const auto& [size, count] : rounded) {
    auto& list = free_slots_[size];
    for (int i = 0; i < count; ++i, at += size) list.push_back(at);
    std::reverse(list.begin(), list.end());  // lowest offset first off the back
  }
}

PoolDevice::PoolDevice(Device& parent, const std::map<std::uint64_t, int>& slots, std::string what)
    : PoolDevice(parent, slot_bytes(slots), std::move(what), &slots) {}

PoolDevice::PoolDevice(Device& parent, std::uint64_t bytes, std::string what)
    : PoolDevice(parent, bytes, std::move(what), nullptr) {}

PoolDevice::~PoolDevice() {
  if (!live_.empty())
    STRATA_LOG(warn, name(), " destroyed with ", live_.size(), " allocations (", format_bytes(used_), ") not freed");
}

std::string PoolDevice::name() const {
  return str_cat(what_, " (", format_bytes(options().budget_bytes), " of ", parent_.name(), ")");
}

void* PoolDevice::allocate(std::size_t bytes, std::string_view what) {
  const std::uint64_t size = Arena::round_up(bytes == 0 ? 1 : bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  std::optional<std::uint64_t> offset;
  if (arena_) {
    offset = arena_->allocate(size);
  } else if (auto it = free_slots_.find(size); it != free_slots_.end() && !it->second.empty()) {
    offset = it->second.back();
    it->second.pop_back();
  }
  if (!offset) {
    std::string why;
    if (arena_) {
      why = str_cat("the largest free block is ", format_bytes(arena_->stats().largest_free_bytes));
    } else {
      std::size_t slots = 0;
      for (const auto& live : live_) slots += live.second == size ? 1 : 0;
      why = slots > 0 ? str_cat("all ", slots, " slots of that size are taken") : "it has no slots of that size";
    }
    STRATA_THROW(Errc::out_of_budget, what_, ": cannot allocate ", format_bytes(size), what.empty() ? "" : " for ",
                 what, ": ", format_bytes(used_), " in use of ", format_bytes(options().budget_bytes), " and ", why,
                 ". Whoever sized the pool counted fewer buffers of this size than are live now");
  }
  live_.emplace(*offset, size);
  used_ += size;
  peak_ = std::max(peak_, used_);
  return block_.as<char>() + *offset;
}

std::uint64_t PoolDevice::offset_of(void* ptr, const char* op) const {
  const char* p = static_cast<const char*>(ptr);
  STRATA_CHECK(p >= block_.as<char>() && p < block_.as<char>() + options().budget_bytes, Errc::internal, what_, ": ",
               op, " of a pointer outside the pool");
  return static_cast<std::uint64_t>(p - block_.as<char>());
}

void PoolDevice::free(void* ptr) {
  if (ptr == nullptr) return;
  const std::uint64_t offset = offset_of(ptr, "free");
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = live_.find(offset);
  STRATA_CHECK(it != live_.end(), Errc::internal, what_, ": free of a pointer that is not a live allocation");
  const std::uint64_t size = it->second;
  live_.erase(it);
  used_ -= size;
  if (arena_)
    arena_->free(offset);
  else
    free_slots_[size].push_back(offset);
}

void* PoolDevice::allocate_async(std::size_t bytes, Stream&, std::string_view what) {
  return allocate(bytes, what);  // the address is valid for all later stream work
}

void PoolDevice::free_async(void* ptr, Stream& stream) {
  if (ptr == nullptr) return;
  offset_of(ptr, "free_async");  // validate now, not when the stream gets there
  stream.launch_host([this, ptr] { free(ptr); });
}

MemoryStats PoolDevice::memory_stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  MemoryStats m;
  m.used_bytes = used_;
  m.peak_bytes = peak_;
  m.budget_bytes = options().budget_bytes;
  m.allocations = live_.size();
  if (arena_) {
    const auto s = arena_->stats();
    m.largest_free_bytes = s.largest_free_bytes;
    m.fragmentation = s.free_bytes == 0 ? 0.0 : 1.0 - static_cast<double>(s.largest_free_bytes) / s.free_bytes;
  } else {
    for (const auto& [size, list] : free_slots_)
      if (!list.empty()) m.largest_free_bytes = std::max(m.largest_free_bytes, size);
  }
  return m;
}

}  // namespace strata::device
