// Best-fit arena: alignment, coalescing, fragmentation statistics, misuse.
#include <catch2/catch.hpp>

#include "runtime/core/error.h"
#include "runtime/device/arena.h"

using strata::device::Arena;

TEST_CASE("arena rounds to 256 B, coalesces neighbours and reports fragmentation", "[arena]") {
  Arena a(4096);
  auto b0 = a.allocate(1), b1 = a.allocate(300), b2 = a.allocate(1024), b3 = a.allocate(256);
  REQUIRE((b0 && b1 && b2 && b3));
  CHECK(*b0 % Arena::kAlignment == 0);
  CHECK(*b1 % Arena::kAlignment == 0);
  CHECK(a.stats().used_bytes == 256 + 512 + 1024 + 256);
  CHECK(a.free(*b1) == 512);
  CHECK(a.free(*b3) == 256);
  auto s = a.stats();
  CHECK(s.free_bytes == 4096 - 1280);
  CHECK(s.largest_free_bytes == 4096 - 1792);  // b3 merged into the tail
  // Freeing b2 merges b1's hole, b2 and the tail into one block.
  a.free(*b2);
  s = a.stats();
  CHECK(s.largest_free_bytes == 4096 - 256);
  CHECK(s.live_blocks == 1);
  a.free(*b0);
  CHECK(a.stats().largest_free_bytes == 4096);
}

TEST_CASE("arena picks the best fitting hole and refuses what does not fit", "[arena][boundary]") {
  Arena a(8 * 256);
  std::uint64_t off[8];
  for (auto& o : off) o = *a.allocate(256);
  CHECK_FALSE(a.allocate(1).has_value());
  a.free(off[1]);  // hole of 1 granule
  a.free(off[3]);
  a.free(off[4]);  // hole of 2
  a.free(off[6]);  // hole of 1
  CHECK_FALSE(a.allocate(3 * 256).has_value());
  CHECK(*a.allocate(512) == off[3]);  // exact fit
  CHECK(*a.allocate(200) == off[1]);  // lowest-size hole first
}

TEST_CASE("freeing an offset twice is an internal error, not corruption", "[arena][negative]") {
  Arena a(1024);
  auto o = *a.allocate(10);
  a.free(o);
  CHECK_THROWS_AS(a.free(o), strata::Error);
  CHECK_THROWS_AS(a.free(12345), strata::Error);
  CHECK(a.stats().free_bytes == 1024);
}
