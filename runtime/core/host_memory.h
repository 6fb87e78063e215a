// How much host RAM this process may still take: the kernel's MemAvailable, capped by the
// memory cgroup's limit less its usage when one is set (containers, Slurm jobs). Used to
// refuse a run before it allocates more than the machine has, rather than after swapping
// or being killed by the OOM killer.
#pragma once

#include <cstdint>
#include <string>

namespace strata {

struct HostMemory {
  std::uint64_t available = 0;  // bytes; ~0 when nothing could be read
  std::string source;           // "MemAvailable" or "cgroup memory.max"
};

HostMemory host_memory_available();

}  // namespace strata
