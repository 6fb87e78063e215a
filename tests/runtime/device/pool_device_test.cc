// PoolDevice (runtime/device/pool_device.h): slots per buffer size that hand out exactly
// what was counted and refuse one more by name; an arena over one block; memory that a
// stream of the parent copies into and out of; the parent's budget charged once, for the
// block. The same on a CUDA device ([cuda], skipped where no GPU is present).
#include <cstring>
#include <vector>

#include <catch2/catch.hpp>

#include "runtime/core/error.h"
#include "runtime/device/pool_device.h"
#include "tests/support/error_of.h"

using namespace strata;
using namespace strata::device;

namespace {

std::unique_ptr<Device> parent_of(Backend b) {
  DeviceOptions o;
  o.backend = b;
  o.budget_bytes = 1 << 20;
  o.pinned_budget_bytes = 1 << 20;
  return Device::create(o);
}

void slots_hold_what_was_counted(Backend backend) {
  auto parent = parent_of(backend);
  {
    PoolDevice pool(*parent, {{256, 2}, {1000, 1}}, "test pool");  // 1000 B rounds to 1024
    CHECK(pool.memory_stats().budget_bytes == 2 * 256 + 1024);
    CHECK(parent->memory_stats().used_bytes == 2 * 256 + 1024);  // the block, once
    std::vector<DeviceBuffer> held;
    held.emplace_back(pool, 100, "a");  // rounds to 256
    held.emplace_back(pool, 256, "b");
    held.emplace_back(pool, 1024, "c");
    CHECK(held[0].get() != held[1].get());
    const auto full = test::error_of([&] { DeviceBuffer(pool, 200, "one too many"); });
    CHECK_THAT(full, Catch::Contains("test pool") && Catch::Contains("one too many") &&
                         Catch::Contains("all 2 slots of that size are taken"));
    const auto other = test::error_of([&] { DeviceBuffer(pool, 512, "a size never counted"); });
    CHECK_THAT(other, Catch::Contains("it has no slots of that size") && Catch::Contains("a size never counted"));
    CHECK(pool.memory_stats().used_bytes == 2 * 256 + 1024);
    held.erase(held.begin());  // a slot back: the next 256 B buffer gets it
    DeviceBuffer again(pool, 256, "again");
    CHECK(pool.memory_stats().peak_bytes == 2 * 256 + 1024);
    CHECK(pool.memory_stats().allocations == 3);

    // Pool memory is device memory of the parent: a parent stream copies in and out.
    auto stream = pool.create_stream();
    PinnedBuffer in(pool, 1024), out(pool, 1024);
    for (int i = 0; i < 1024; ++i) static_cast<unsigned char*>(in.get())[i] = static_cast<unsigned char>(i * 7);
    stream->copy_async(held[1].get(), in.get(), 1024, CopyKind::host_to_device);
    stream->copy_async(out.get(), held[1].get(), 1024, CopyKind::device_to_host);
    stream->synchronize();
    CHECK(std::memcmp(in.get(), out.get(), 1024) == 0);
  }
  CHECK(parent->memory_stats().used_bytes == 0);  // the block went back with the pool
}

void arena_holds_a_block(Backend backend) {
  auto parent = parent_of(backend);
  PoolDevice pool(*parent, 4096, "arena pool");
  {
    DeviceBuffer a(pool, 1000), b(pool, 3000);
    CHECK_THAT(test::error_of([&] { DeviceBuffer(pool, 256, "x"); }),
               Catch::Contains("arena pool") && Catch::Contains("the largest free block is"));
  }
  DeviceBuffer whole(pool, 4096);  // everything freed: one block again
  CHECK(pool.memory_stats().used_bytes == 4096);
  const auto outside = test::error_of([&] { pool.free(parent.get()); });
  CHECK_THAT(outside, Catch::Contains("outside the pool"));
}

}  // namespace

TEST_CASE("a slot pool hands out what was counted and refuses one more by name (host)", "[device]") {
  slots_hold_what_was_counted(Backend::host);
}
TEST_CASE("a slot pool hands out what was counted and refuses one more by name (cuda)", "[cuda]") {
  slots_hold_what_was_counted(Backend::cuda);
}
TEST_CASE("an arena pool is best fit over one block (host)", "[device]") { arena_holds_a_block(Backend::host); }
TEST_CASE("an arena pool is best fit over one block (cuda)", "[cuda]") { arena_holds_a_block(Backend::cuda); }
