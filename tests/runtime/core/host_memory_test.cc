// The process's resident set as strata train logs it and strata estimate predicts it: pages
// count once touched, and the high-water mark keeps the peak after they are returned. The
// cgroup limit the host-RAM guard reads, on fake cgroup trees of both versions.
#include <sys/mman.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "runtime/core/cgroup_memory.h"
#include "runtime/core/host_memory.h"
#include "tests/support/temp_dir.h"

namespace strata {
namespace {

TEST_CASE("process RSS grows with touched pages and the peak outlives them", "[core]") {
  constexpr std::size_t kBytes = std::size_t{64} << 20;
  const std::uint64_t before = process_rss_bytes();
  REQUIRE(before > 0);
  void* p = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(p != MAP_FAILED);
  // Mapped but untouched: not resident.
  CHECK(process_rss_bytes() < before + kBytes / 8);
  std::memset(p, 1, kBytes);
  const std::uint64_t touched = process_rss_bytes();
  CHECK(touched >= before + kBytes - (std::uint64_t{1} << 20));
  // The kernel's counters behind the two files settle up to a few dozen pages apart.
  constexpr std::uint64_t kSlack = std::uint64_t{1} << 20;
  CHECK(process_peak_rss_bytes() + kSlack >= touched);
  munmap(p, kBytes);
  CHECK(process_rss_bytes() < touched - kBytes / 2);
  CHECK(process_peak_rss_bytes() + kSlack >= touched);  // the high-water mark stays
}

void put(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path) << text << "\n";
}

TEST_CASE("the cgroup limit is the tightest on the way up from the process's own cgroup, v1 and v2",
          "[core][regression]") {
  // Before: only the top-level cgroup v2 memory.max was read, so a Slurm job's nested limit,
  // and every cgroup v1 host (this CI machine is one), went unseen.
  test::TempDir dir("strata-cgroup");
  const std::string root = dir.path();
  // v2: a job cgroup at 8 GiB inside a slice at 16 GiB, the top without a limit.
  put(root + "/memory.max", "max");
  put(root + "/memory.current", "1000");
  put(root + "/system.slice/memory.max", "17179869184");
  put(root + "/system.slice/job_42/memory.max", "8589934592");
  put(root + "/system.slice/job_42/memory.current", "1073741824");
  auto v2 = cgroup_memory_room("0::/system.slice/job_42\n", root);
  REQUIRE(v2);
  CHECK(v2->limit == 8589934592u);
  CHECK(v2->room == 8589934592u - 1073741824u);
  CHECK(v2->where == root + "/system.slice/job_42/memory.max");
  // The slice is tighter than the job: the slice's limit counts.
  put(root + "/system.slice/memory.max", "4294967296");
  v2 = cgroup_memory_room("0::/system.slice/job_42\n", root);
  REQUIRE(v2);
  CHECK(v2->limit == 4294967296u);
  CHECK(v2->where == root + "/system.slice/memory.max");
  // v1: the memory controller's hierarchy, "unlimited" at the top (2^63 rounded to a page).
  put(root + "/memory/memory.limit_in_bytes", "9223372036854771712");
  put(root + "/memory/memory.usage_in_bytes", "5");
  put(root + "/memory/slurm/uid_0/job_7/memory.limit_in_bytes", "2147483648");
  put(root + "/memory/slurm/uid_0/job_7/memory.usage_in_bytes", "147483648");
  const auto v1 = cgroup_memory_room("4:memory:/slurm/uid_0/job_7\n2:cpu,cpuacct:/\n", root);
  REQUIRE(v1);
  CHECK(v1->limit == 2147483648u);
  CHECK(v1->room == 2000000000u);
  // A cgroup namespace shows our cgroup as "/..." that is not under the mount: the mount's
  // own files are ours. No limit anywhere: nothing.
  CHECK_FALSE(cgroup_memory_room("4:memory:/elsewhere\n", root));
  put(root + "/memory/memory.limit_in_bytes", "3221225472");
  const auto ns = cgroup_memory_room("4:memory:/elsewhere\n", root);
  REQUIRE(ns);
  CHECK(ns->limit == 3221225472u);
  CHECK(ns->room == 3221225472u - 5u);
  CHECK_FALSE(cgroup_memory_room("", root));
  CHECK_FALSE(cgroup_memory_room("garbage without colons\n", root));
}

}  // namespace
}  // namespace strata
