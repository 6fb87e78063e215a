// Best-fit arena (see arena.h).
#include "runtime/device/arena.h"

#include "runtime/core/error.h"

namespace strata::device {

Arena::Arena(std::uint64_t capacity) : capacity_(capacity / kAlignment * kAlignment) {
  if (capacity_ > 0) insert_free(0, capacity_);
}

void Arena::insert_free(std::uint64_t offset, std::uint64_t size) {
  free_by_offset_.emplace(offset, size);
  free_by_size_.emplace(size, offset);
}

void Arena::erase_free(std::uint64_t offset, std::uint64_t size) {
  free_by_offset_.erase(offset);
  auto [lo, hi] = free_by_size_.equal_range(size);
  for (auto it = lo; it != hi; ++it) {
    if (it->second == offset) {
      free_by_size_.erase(it);
      return;
    }
  }
}

std::optional<std::uint64_t> Arena::allocate(std::uint64_t bytes) {
  const std::uint64_t size = round_up(bytes == 0 ? 1 : bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = free_by_size_.lower_bound(size);
  if (it == free_by_size_.end()) return std::nullopt;
  const std::uint64_t block_size = it->first, offset = it->second;
  erase_free(offset, block_size);
  if (block_size > size) insert_free(offset + size, block_size - size);
  live_.emplace(offset, size);
  used_ += size;
  return offset;
}

std::uint64_t Arena::free(std::uint64_t offset) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto live = live_.find(offset);
  STRATA_CHECK(live != live_.end(), Errc::internal, "arena free of offset ", offset,
               " that is not a live allocation (double free or foreign pointer)");
  std::uint64_t start = offset, size = live->second;
  const std::uint64_t freed = size;
  live_.erase(live);
  used_ -= freed;
  auto next = free_by_offset_.lower_bound(start);
  if (next != free_by_offset_.end() && next->first == start + size) {
    const std::uint64_t n_off = next->first, n_size = next->second;
    erase_free(n_off, n_size);
    size += n_size;
  }
  auto prev = free_by_offset_.lower_bound(start);
  if (prev != free_by_offset_.begin()) {
    --prev;
    if (prev->first + prev->second == start) {
      const std::uint64_t p_off = prev->first, p_size = prev->second;
      erase_free(p_off, p_size);
      start = p_off;
      size += p_size;
    }
  }
  insert_free(start, size);
  return freed;
}

Arena::Stats Arena::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::uint64_t largest = free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
  return {used_, capacity_ - used_, largest, live_.size()};
}

}  // namespace strata::device
