// Page-locked host memory without CUDA: page-aligned mmap plus mlock. Where mlock is
// refused (RLIMIT_MEMLOCK too small, no CAP_IPC_LOCK) the memory stays pageable and one
// warning says so, naming the limit and how to raise it; the allocation still succeeds.
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata::device {

struct PinnedAllocation {
  void* ptr = nullptr;
  std::size_t bytes = 0;  // mapped size (page-rounded)
  bool locked = false;    // mlock succeeded
};

PinnedAllocation pinned_map(std::size_t bytes);
void pinned_unmap(const PinnedAllocation& allocation) noexcept;

// RLIMIT_MEMLOCK soft limit in bytes; UINT64_MAX when unlimited.
std::uint64_t memlock_limit_bytes() noexcept;

}  // namespace strata::device
