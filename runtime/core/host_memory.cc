// host_memory_available, host_name and the process's resident set (see host_memory.h).
#include "runtime/core/host_memory.h"

#include <unistd.h>

#include <fstream>
#include <sstream>

#include "runtime/core/cgroup_memory.h"

namespace strata {

HostMemory host_memory_available() {
  HostMemory m{~std::uint64_t{0}, "unknown"};
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  std::uint64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") {
      m.available = kib * 1024;
      m.source = "MemAvailable in /proc/meminfo";
      break;
    }
  }
  std::ifstream self("/proc/self/cgroup");
  std::stringstream text;
  text << self.rdbuf();
  if (const auto c = cgroup_memory_room(text.str(), "/sys/fs/cgroup"); c && c->room < m.available) {
    m.available = c->room;
    m.source = "the memory cgroup's limit (" + c->where + ") less its usage";
  }
  return m;
}

std::uint64_t process_rss_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::uint64_t size = 0, resident = 0;
  if (!(statm >> size >> resident)) return 0;
  return resident * static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
}

std::uint64_t process_peak_rss_bytes() {
  std::ifstream status("/proc/self/status");
  std::string key;
  while (status >> key) {
    if (key == "VmHWM:") {
      std::uint64_t kib = 0;
      return status >> kib ? kib * 1024 : 0;
    }
    status.ignore(1 << 20, '\n');
  }
  return 0;
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "?";
  return name;
}

}  // namespace strata
