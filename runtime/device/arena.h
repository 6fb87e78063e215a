// Best-fit allocator over a fixed range of offsets [0, capacity), with coalescing of
// neighbouring free blocks. It owns no memory: the host backend maps one region of its
// device budget and hands out base + offset. Thread-safe (one mutex; allocation is not on
// any hot path that runs per element). Fragmentation = 1 - largest_free / total_free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>

namespace strata::device {

class Arena {
 public:
  static constexpr std::uint64_t kAlignment = 256;  // as cudaMalloc guarantees

  explicit Arena(std::uint64_t capacity);

  // Offset of a block of at least `bytes` (rounded up to kAlignment), or nullopt.
  std::optional<std::uint64_t> allocate(std::uint64_t bytes);
  // Frees the block at `offset`; returns its rounded size. Throws Errc::internal for an
  // offset that is not a live block (double free or foreign pointer).
  std::uint64_t free(std::uint64_t offset);

  struct Stats {
    std::uint64_t used_bytes, free_bytes, largest_free_bytes, live_blocks;
  };
  Stats stats() const;
  static std::uint64_t round_up(std::uint64_t bytes) noexcept {
    return (bytes + kAlignment - 1) / kAlignment * kAlignment;
  }

 private:
  void insert_free(std::uint64_t offset, std::uint64_t size);
  void erase_free(std::uint64_t offset, std::uint64_t size);

  mutable std::mutex mutex_;
  std::uint64_t capacity_;
  std::uint64_t used_ = 0;
  std::map<std::uint64_t, std::uint64_t> free_by_offset_;     // offset -> size
  std::multimap<std::uint64_t, std::uint64_t> free_by_size_;  // size -> offset
  std::map<std::uint64_t, std::uint64_t> live_;               // offset -> size
};

}  // namespace strata::device
