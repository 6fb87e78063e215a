// Strata's own accounting against the ZeRO paper's per-rank model-state formulas (counted with
// fp32 gradients, the "18 B" form): Psi is the padded parameter count, N the world size.
//   stage 0: 2Psi + 4Psi + 12Psi      stage 1: 2Psi + 4Psi + 12Psi/N
//   stage 2: 2Psi + 16Psi/N           stage 3: 18Psi/N
// and stage 3 never holds more than stage3_max_live_parameters gathered.
#include <sys/mman.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/device/device.h"
#include "tests/engine/engine_support.h"

using namespace strata;

TEST_CASE("per-rank model-state bytes match the ZeRO formulas for every stage", "[zero][memory]") {
  const int stage = GENERATE(0, 1, 2, 3);
  const int world = GENERATE(1, 2, 4);
  test::TrainSpec spec;
  spec.world = world;
  spec.steps = 2;
  spec.config = test::mlp_config(stage, world, DType::bf16);
  spec.config.zero.stage3_param_persistence_threshold = 0;  // no layer kept whole
  const auto run = test::train_mlp(spec);
  // 3 layers of 32x32 + 32 = 1056 elements in buckets of <= 300 (rounded to whole units of
  // world x 16): padding is per bucket.
  std::uint64_t psi = 0;
  const std::size_t unit = static_cast<std::size_t>(world) * 16;
  const std::size_t bucket = std::max(unit, 300 / unit * unit);
  for (int l = 0; l < 3; ++l) {
    for (std::size_t off = 0; off < 1056; off += bucket) psi += (std::min(bucket, 1056 - off) + unit - 1) / unit * unit;
  }
  const std::uint64_t n = static_cast<std::uint64_t>(world);
  const auto& used = run.memory.device.kind_used;
  const std::uint64_t params = used[static_cast<int>(engine::Kind::params)];
  const std::uint64_t grads = used[static_cast<int>(engine::Kind::grads)];
  const std::uint64_t optim = used[static_cast<int>(engine::Kind::optimizer)];
  INFO("stage " << stage << " world " << world << " psi " << psi);
  CHECK(params == (stage == 3 ? 2 * psi / n : 2 * psi));
  CHECK(grads == (stage <= 1 ? 4 * psi : 4 * psi / n));
  CHECK(optim == (stage == 0 ? 12 * psi : 12 * psi / n));
  const std::uint64_t total = params + grads + optim;
  const std::uint64_t formula[] = {18 * psi, 6 * psi + 12 * psi / n, 2 * psi + 16 * psi / n, 18 * psi / n};
  CHECK(total == formula[stage]);
  // Transient buffers (gradient buffers, gathered layers) are back to zero after a step.
  CHECK(used[static_cast<int>(engine::Kind::buffers)] == 0);
  CHECK(run.memory.device.peak_bytes <= run.memory.device.budget_bytes);
}

TEST_CASE("stage 3 never holds more than stage3_max_live_parameters gathered", "[zero][memory]") {
  const std::uint64_t max_live = GENERATE(1056u, 2u * 1056u, 1000000u);
  test::TrainSpec spec;
  spec.world = 2;
  spec.layers = 4;
  spec.steps = 3;
  spec.config = test::mlp_config(3, 2, DType::bf16);
  spec.config.zero.reduce_bucket_size = 100000;  // one bucket per layer of 1056 (a multiple of 2 x 16: no padding)
  spec.config.zero.stage3_param_persistence_threshold = 0;
  spec.config.zero.stage3_max_live_parameters = max_live;
  const auto run = test::train_mlp(spec);
  INFO("max_live " << max_live << " peak " << run.memory.peak_gathered_elems);
  CHECK(run.memory.peak_gathered_elems <= max_live);
  CHECK(run.memory.peak_gathered_elems >= 1056);
  if (max_live >= 2 * 1056) CHECK(run.memory.peak_gathered_elems >= 2 * 1056);  // prefetch did run ahead
}

TEST_CASE("retire() frees from stream work: use drops at once, the memory returns on the owner's thread",
          "[zero][memory]") {
  device::DeviceOptions d;
  d.budget_bytes = 1 << 20;
  auto dev = device::Device::create(d);
  engine::MemoryLedger ledger(*dev, 1 << 20, false);
  void* p = ledger.allocate(engine::Tier::device, engine::Kind::buffers, 768 << 10, "test buffer");
  void* h = ledger.allocate(engine::Tier::host, engine::Kind::buffers, 768 << 10, "host buffer");
  auto stream = dev->create_stream();
  stream->launch_host([&] {
    ledger.retire(p);
    ledger.retire(h);
  });
  stream->synchronize();
  CHECK(ledger.usage(engine::Tier::device).used_bytes == 0);
  CHECK(ledger.usage(engine::Tier::host).used_bytes == 0);
  CHECK(ledger.usage(engine::Tier::device).kind_peak[static_cast<int>(engine::Kind::buffers)] == 768u << 10);
  CHECK(dev->memory_stats().used_bytes >= 768u << 10);  // still held by the Device until reaped
  // The next allocation reaps first, so the budget has room for it again.
  void* q = ledger.allocate(engine::Tier::device, engine::Kind::buffers, 768 << 10, "second buffer");
  void* g = ledger.allocate(engine::Tier::host, engine::Kind::buffers, 768 << 10, "second host buffer");
  CHECK(dev->memory_stats().used_bytes < (1u << 20));
  ledger.free(q);
  ledger.free(g);
  CHECK(dev->memory_stats().used_bytes == 0);
}

TEST_CASE("freed page-locked staging is reused, and handed back when the host budget runs short", "[zero][memory]") {
  device::DeviceOptions d;
  d.budget_bytes = 1 << 20;
  auto dev = device::Device::create(d);
  engine::MemoryLedger ledger(*dev, 1 << 20, /*pin_host=*/false);
  void* a = ledger.allocate(engine::Tier::host, engine::Kind::buffers, 600 << 10, "staging", /*pinned=*/true);
  CHECK(dev->pinned_stats().allocations == 1);
  ledger.free(a);
  CHECK(ledger.usage(engine::Tier::host).used_bytes == 0);
  CHECK(dev->pinned_stats().allocations == 1);  // cached, not unlocked
  void* b = ledger.allocate(engine::Tier::host, engine::Kind::buffers, 600 << 10, "staging again", true);
  CHECK(b == a);
  CHECK(dev->pinned_stats().allocations == 1);
  ledger.free(b);
  // 600 KiB cached + 600 KiB asked > the 1 MiB budget: the cache gives way.
  void* c = ledger.allocate(engine::Tier::host, engine::Kind::optimizer, 600 << 10, "state");
  CHECK(dev->pinned_stats().allocations == 0);
  CHECK(ledger.usage(engine::Tier::host).used_bytes == 600u << 10);
  ledger.free(c);
}

TEST_CASE("pageable host buffers are reused, and unmapped when the host budget runs short", "[zero][memory]") {
  device::DeviceOptions d;
  d.budget_bytes = 1 << 20;
  auto dev = device::Device::create(d);
  engine::MemoryLedger ledger(*dev, 100 << 10, /*pin_host=*/false);
  // Smaller than malloc's mmap threshold: from malloc it would stay mapped in its heap.
  auto* a = static_cast<unsigned char*>(ledger.allocate(engine::Tier::host, engine::Kind::buffers, 64 << 10, "a"));
  std::fill(a, a + (64 << 10), 1);
  const auto mapped = [](void* p) {
    unsigned char resident = 0;
    return ::mincore(p, 4096, &resident) == 0;
  };
  CHECK(mapped(a));
  ledger.free(a);
  CHECK(ledger.usage(engine::Tier::host).used_bytes == 0);
  void* b = ledger.allocate(engine::Tier::host, engine::Kind::buffers, 64 << 10, "b, the same size");
  CHECK(b == a);  // the cached buffer
  ledger.free(b);
  // 64 KiB cached + 64 KiB asked > the 100 KiB budget: the cache gives way, back to the kernel.
  void* c = ledger.allocate(engine::Tier::host, engine::Kind::optimizer, 48 << 10, "c, another size");
  CHECK_FALSE(mapped(a));
  CHECK(ledger.usage(engine::Tier::host).used_bytes == 48u << 10);
  ledger.free(c);
}

TEST_CASE("pageable buffers churning through the cache never evict a page-locked one", "[zero][memory]") {
  device::DeviceOptions d;
  d.budget_bytes = 1 << 20;
  auto dev = device::Device::create(d);
  engine::MemoryLedger ledger(*dev, 1 << 20, /*pin_host=*/false);
  void* locked = ledger.allocate(engine::Tier::host, engine::Kind::buffers, 64 << 10, "staging", /*pinned=*/true);
  ledger.free(locked);
  std::vector<void*> pageable;
  for (int i = 0; i < 40; ++i)
    pageable.push_back(ledger.allocate(engine::Tier::host, engine::Kind::buffers, 4096, "pageable"));
  for (void* p : pageable) ledger.free(p);  // more than the cache keeps: the oldest pageable ones go
  CHECK(dev->pinned_stats().allocations == 1);
  CHECK(ledger.allocate(engine::Tier::host, engine::Kind::buffers, 64 << 10, "staging again", true) == locked);
  CHECK(dev->pinned_stats().allocations == 1);
  ledger.free(locked);
}

TEST_CASE("the host tier's budget edge is exact: the last byte fits, one more does not", "[zero][memory][negative]") {
  device::DeviceOptions d;
  d.budget_bytes = 1 << 20;
  auto dev = device::Device::create(d);
  engine::MemoryLedger ledger(*dev, 4096, false);
  void* a = ledger.allocate(engine::Tier::host, engine::Kind::buffers, 4000, "most");
  void* b = ledger.allocate(engine::Tier::host, engine::Kind::buffers, 96, "the rest");
  CHECK(ledger.usage(engine::Tier::host).used_bytes == 4096);
  CHECK_THROWS_AS(ledger.allocate(engine::Tier::host, engine::Kind::buffers, 1, "one byte more"), Error);
  ledger.free(b);
  void* c = ledger.allocate(engine::Tier::host, engine::Kind::buffers, 96, "the rest again");
  ledger.free(c);
  ledger.free(a);
}
