// This host: how much RAM this process may still take (the kernel's MemAvailable, capped by
// the memory cgroup's limit less its usage when one is set: containers, Slurm jobs), used to
// refuse a run before it allocates more than the machine has rather than after swapping or
// being killed by the OOM killer; and its name, which tells ranks that share it apart. This
// process: its resident set now and at its peak (what `strata train` reports beside the
// ledger, and what `strata estimate` predicts the growth of).
#pragma once

#include <cstdint>
#include <string>

namespace strata {

struct HostMemory {
  std::uint64_t available = 0;  // bytes; ~0 when nothing could be read
  std::string source;           // MemAvailable, or the cgroup limit file that is tighter
};

HostMemory host_memory_available();
std::string host_name();  // gethostname(), or "?"

std::uint64_t process_rss_bytes();       // resident bytes now (/proc/self/statm); 0 when unreadable
std::uint64_t process_peak_rss_bytes();  // the resident high-water mark so far (VmHWM); 0 when unreadable

}  // namespace strata
