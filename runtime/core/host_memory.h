// This host: how much RAM this process may still take (the kernel's MemAvailable, capped by
// the memory cgroup's limit less its usage when one is set: containers, Slurm jobs), used to
// refuse a run before it allocates more than the machine has rather than after swapping or
// being killed by the OOM killer; and its name, which tells ranks that share it apart.
#pragma once

#include <cstdint>
#include <string>

namespace strata {

struct HostMemory {
  std::uint64_t available = 0;  // bytes; ~0 when nothing could be read
  std::string source;           // "MemAvailable" or "cgroup memory.max"
};

HostMemory host_memory_available();
std::string host_name();  // gethostname(), or "?"

}  // namespace strata
