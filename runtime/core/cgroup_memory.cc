// cgroup_memory_room (see cgroup_memory.h).
#include "runtime/core/cgroup_memory.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

namespace strata {
namespace {

namespace fs = std::filesystem;

// A number from a cgroup file; nothing for "max", absent files and v1's "unlimited" (a
// page-rounded 2^63 - 1).
std::optional<std::uint64_t> read_value(const fs::path& p) {
  std::ifstream in(p);
  std::string text;
  if (!(in >> text) || text == "max") return std::nullopt;
  try {
    const std::uint64_t v = std::stoull(text);
    if (v >= (std::uint64_t{1} << 62)) return std::nullopt;
    return v;
  } catch (...) {
    return std::nullopt;
  }
}

// The tightest of `limit_file` from `dir` up to `top`, and `usage_file` at `dir`.
std::optional<CgroupRoom> walk(const fs::path& top, const std::string& rel, const char* limit_file,
                               const char* usage_file) {
  std::error_code ec;
  fs::path dir = top / fs::path(rel).relative_path();
  if (!fs::is_directory(dir, ec)) dir = top;  // a cgroup namespace: our cgroup is the root
  if (!fs::exists(dir / usage_file, ec)) return std::nullopt;
  std::optional<CgroupRoom> best;
  for (fs::path d = dir;; d = d.parent_path()) {
    if (const auto v = read_value(d / limit_file); v && (!best || *v < best->limit))
      best = CgroupRoom{0, *v, (d / limit_file).string()};
    if (d == top || d.parent_path() == d || d.string().size() <= top.string().size()) break;
  }
  if (!best) return std::nullopt;
  const std::uint64_t usage = read_value(dir / usage_file).value_or(0);
  best->room = best->limit > usage ? best->limit - usage : 0;
  return best;
}

}  // namespace

std::optional<CgroupRoom> cgroup_memory_room(const std::string& proc_self_cgroup, const std::string& root) {
  std::optional<CgroupRoom> best;
  auto take = [&](std::optional<CgroupRoom> r) {
    if (r && (!best || r->room < best->room)) best = std::move(r);
  };
  std::istringstream lines(proc_self_cgroup);
  std::string line;
  while (std::getline(lines, line)) {
    // "hierarchy-id:controllers:path"; v2 is "0::path".
    const auto a = line.find(':'), b = line.find(':', a == std::string::npos ? a : a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string id = line.substr(0, a), controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (id == "0" && controllers.empty()) {
      take(walk(root, path, "memory.max", "memory.current"));
      take(walk(fs::path(root) / "unified", path, "memory.max", "memory.current"));
    } else {
      std::istringstream names(controllers);
      for (std::string c; std::getline(names, c, ',');) {
        if (c == "memory")
          take(walk(fs::path(root) / "memory", path, "memory.limit_in_bytes", "memory.usage_in_bytes"));
      }
    }
  }
  return best;
}

}  // namespace strata
