// The process's resident set as strata train logs it and strata estimate predicts it: pages
// count once touched, and the high-water mark keeps the peak after they are returned.
#include <sys/mman.h>

#include <catch2/catch.hpp>
#include <cstring>

#include "runtime/core/host_memory.h"

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

}  // namespace
}  // namespace strata
