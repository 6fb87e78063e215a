// The aligned buffer pool: alignment, lending and returning, blocking acquire, device pin
// hooks, the mlock fallback, and registration with an engine (fixed-buffer I/O).
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <set>
#include <thread>

#include "io/aligned.h"
#include "io/buffer_pool.h"
#include "io/engine.h"
#include "tests/io/io_test_util.h"
#include "tests/support/child.h"
#include "tests/support/temp_dir.h"

using namespace strata;
using namespace strata::test;
using namespace std::chrono_literals;

namespace {

io::BufferPool make_pool(io::Engine* engine, std::size_t count, std::size_t bytes, io::PinHooks hooks = {}) {
  io::PoolOptions o;
  o.count = count;
  o.buffer_bytes = bytes;
  o.hooks = std::move(hooks);
  auto p = io::BufferPool::create(engine, o);
  INFO(p.status().message());
  REQUIRE(p.ok());
  return std::move(p).value();
}

}  // namespace

TEST_CASE("pool buffers are 4 KiB aligned, distinct, and come back when released", "[buffer_pool]") {
  auto pool = make_pool(nullptr, 4, 10000);
  CHECK(pool.buffer_bytes() == 12288);
  CHECK(pool.registered() == 0);
  std::vector<io::PoolBuffer> leases;
  std::set<std::byte*> seen;
  for (int i = 0; i < 4; ++i) {
    leases.push_back(pool.acquire());
    CHECK(io::is_aligned(leases.back().data()));
    CHECK(leases.back().bytes() == 12288);
    std::memset(leases.back().data(), i, leases.back().bytes());  // all of it is usable
    seen.insert(leases.back().data());
  }
  CHECK(seen.size() == 4);
  CHECK(pool.available() == 0);
  CHECK_FALSE(pool.try_acquire().valid());
  CHECK_FALSE(pool.acquire_for(5ms).valid());
  leases[1].release();
  CHECK_FALSE(leases[1].valid());
  CHECK(pool.available() == 1);
  auto again = pool.try_acquire();
  CHECK(again.valid());
  leases.clear();
  again = io::PoolBuffer();
  CHECK(pool.available() == 4);
}

TEST_CASE("acquire blocks until another thread releases a buffer", "[buffer_pool]") {
  auto pool = make_pool(nullptr, 1, 4096);
  auto held = pool.acquire();
  std::atomic<bool> got{false};
  std::thread waiter([&] {
    auto b = pool.acquire();
    got = b.valid();
  });
  std::this_thread::sleep_for(20ms);
  CHECK_FALSE(got);
  held.release();
  waiter.join();
  CHECK(got);
}

TEST_CASE("a lease keeps the pool's memory alive after the pool is gone", "[buffer_pool][boundary]") {
  io::PoolBuffer lease;
  {
    auto pool = make_pool(nullptr, 2, 8192);
    lease = pool.acquire();
  }
  std::memset(lease.data(), 0x5a, lease.bytes());  // ASan would flag freed memory
  CHECK(static_cast<int>(lease.data()[8191]) == 0x5a);
}

TEST_CASE("pin hooks see the whole pool once and unpin it when the memory goes", "[buffer_pool]") {
  int pins = 0, unpins = 0;
  void* pinned_at = nullptr;
  std::size_t pinned_bytes = 0;
  io::PinHooks hooks;
  hooks.pin = [&](void* p, std::size_t n) {
    ++pins;
    pinned_at = p;
    pinned_bytes = n;
    return 0;
  };
  hooks.unpin = [&](void* p, std::size_t n) {
    ++unpins;
    CHECK(p == pinned_at);
    CHECK(n == pinned_bytes);
  };
  {
    auto pool = make_pool(nullptr, 3, 4096, hooks);
    CHECK(pool.pinned());
    CHECK(pins == 1);
    CHECK(pinned_bytes == 3 * 4096);
    CHECK(pool.acquire().data() >= static_cast<std::byte*>(pinned_at));
  }
  CHECK(unpins == 1);
}

TEST_CASE("a refused pin hook leaves a working, unpinned pool and one warning", "[buffer_pool][negative]") {
  WarningCatcher warnings;
  int unpins = 0;
  io::PinHooks hooks;
  hooks.pin = [](void*, std::size_t) { return -ENOMEM; };
  hooks.unpin = [&](void*, std::size_t) { ++unpins; };
  {
    auto pool = make_pool(nullptr, 2, 4096, hooks);
    CHECK_FALSE(pool.pinned());
    CHECK(pool.acquire().valid());
  }
  CHECK(unpins == 0);
  CHECK_THAT(warnings.joined(), Catch::Contains("pin hook refused") && Catch::Contains("ENOMEM"));
}

TEST_CASE("where mlock is refused the pool falls back to pageable memory with a warning", "[buffer_pool][negative]") {
  // Root has CAP_IPC_LOCK, which ignores RLIMIT_MEMLOCK: drop to an unprivileged uid first.
  const ChildResult child = run_in_child([]() -> std::string {
    rlimit lim{0, 0};
    if (setrlimit(RLIMIT_MEMLOCK, &lim) != 0) return "setup: setrlimit";
    if (geteuid() == 0 && (setresgid(65534, 65534, 65534) != 0 || setresuid(65534, 65534, 65534) != 0)) {
      return "setup: cannot drop privileges";
    }
    WarningCatcher warnings;
    io::PoolOptions o;
    o.count = 2;
    o.buffer_bytes = 1 << 20;
    auto pool = io::BufferPool::create(nullptr, o);
    if (!pool) return "create failed: " + pool.status().message();
    auto b = pool->acquire();
    std::memset(b.data(), 1, b.bytes());
    return "locked=" + std::to_string(pool->locked()) + " " + warnings.joined();
  });
  INFO(child.output);
  REQUIRE(child.exit_code == 0);
  CHECK_THAT(child.output, Catch::StartsWith("locked=0") && Catch::Contains("mlock") &&
                               Catch::Contains("RLIMIT_MEMLOCK") && Catch::Contains("ulimit -l"));
}

TEST_CASE("pool buffers are registered with the engine and used as fixed buffers", "[uring]") {
  TempDir dir;
  auto engine = make_engine();
  auto file = open_file(engine, dir.file("f"));
  auto pool = make_pool(&engine, 3, 256 << 10);
  CHECK(pool.registered() == 3);
  auto a = pool.acquire();
  auto b = pool.acquire();
  fill_pattern(a.data(), a.bytes(), 21);
  REQUIRE(engine.write(file, 0, a.data(), a.bytes()).wait().ok());
  REQUIRE(engine.read(file, 0, b.data(), b.bytes()).wait().ok());
  CHECK(first_mismatch(b.data(), b.bytes(), 21) == -1);
  CHECK(engine.stats().fixed_buffer_pieces >= 2);
}

TEST_CASE("a pool may outlive its engine and an engine may outlive its pool", "[uring][boundary]") {
  std::optional<io::BufferPool> outlives;
  {
    auto engine = make_engine();
    outlives = make_pool(&engine, 2, 4096);
    auto short_lived = make_pool(&engine, 2, 4096);
    CHECK(short_lived.registered() == 2);
  }
  auto lease = outlives->acquire();
  std::memset(lease.data(), 0, lease.bytes());
  // Slots freed by the short-lived pool are reused by a new one on a new engine.
  auto engine = make_engine(io::EngineOptions{32, 1u << 20, 8, false, 100, 64, 2});
  auto p1 = make_pool(&engine, 2, 4096);
  CHECK(p1.registered() == 2);
}

TEST_CASE("a pool larger than the fixed-buffer table registers what fits and still works", "[uring][boundary]") {
  TempDir dir;
  io::EngineOptions o;
  o.max_buffers = 2;
  WarningCatcher warnings;
  auto engine = make_engine(o);
  auto pool = make_pool(&engine, 3, 64 << 10);
  CHECK(pool.registered() == 2);
  CHECK_THAT(warnings.joined(), Catch::Contains("ENOBUFS"));
  auto file = open_file(engine, dir.file("f"));
  std::vector<io::PoolBuffer> all;
  for (int i = 0; i < 3; ++i) all.push_back(pool.acquire());
  for (int i = 0; i < 3; ++i) {
    fill_pattern(all[i].data(), all[i].bytes(), 50 + i);
    REQUIRE(engine.write(file, i * all[i].bytes(), all[i].data(), all[i].bytes()).wait().ok());
  }
  for (int i = 0; i < 3; ++i) {
    std::memset(all[i].data(), 0, all[i].bytes());
    REQUIRE(engine.read(file, i * all[i].bytes(), all[i].data(), all[i].bytes()).wait().ok());
    CHECK(first_mismatch(all[i].data(), all[i].bytes(), 50 + i) == -1);
  }
}
