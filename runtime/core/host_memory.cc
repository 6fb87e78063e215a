// host_memory_available (see host_memory.h).
#include "runtime/core/host_memory.h"

#include <unistd.h>

#include <fstream>
#include <sstream>

namespace strata {
namespace {

bool read_u64(const char* path, std::uint64_t& out) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text == "max") return false;
  try {
    out = std::stoull(text);
  } catch (...) {
    return false;
  }
  return true;
}

}  // namespace

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
  std::uint64_t limit = 0, usage = 0;
  if (read_u64("/sys/fs/cgroup/memory.max", limit) && read_u64("/sys/fs/cgroup/memory.current", usage)) {
    const std::uint64_t room = limit > usage ? limit - usage : 0;
    if (room < m.available) {
      m.available = room;
      m.source = "the memory cgroup's memory.max less memory.current";
    }
  }
  return m;
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "?";
  return name;
}

}  // namespace strata
