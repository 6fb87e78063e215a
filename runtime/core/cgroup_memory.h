// The memory limit of the cgroups this process lives in, as the kernel enforces it: the
// tightest limit on the path from the process's own cgroup up to the hierarchy's root,
// less what its own cgroup uses. Read from /proc/self/cgroup and the cgroup filesystem, for
// both cgroup v2 (the unified hierarchy: memory.max, memory.current; at /sys/fs/cgroup or,
// on a hybrid host, /sys/fs/cgroup/unified) and cgroup v1 (the memory controller's
// hierarchy: memory.limit_in_bytes, memory.usage_in_bytes). A Slurm job or a container
// puts a process in a nested cgroup whose limit the top level does not show; a cgroup
// namespace shows the process's own cgroup as the root, so when its path is not found
// under the hierarchy the hierarchy's root files are read instead.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace strata {

struct CgroupRoom {
  std::uint64_t room = 0;  // the tightest limit less the usage, in bytes
  std::uint64_t limit = 0;
  std::string where;  // the file that set the limit
};

// `proc_self_cgroup`: the text of /proc/self/cgroup; `root`: where the cgroup filesystems
// are mounted ("/sys/fs/cgroup"). Nothing when no limit is set or nothing can be read.
std::optional<CgroupRoom> cgroup_memory_room(const std::string& proc_self_cgroup, const std::string& root);

}  // namespace strata
