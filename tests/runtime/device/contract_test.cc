// One contract, two backends: every test here runs on the host backend ([device]) and on
// the CUDA backend ([cuda]; skipped with the reason where no GPU is present).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <numeric>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "runtime/core/dtype.h"
#include "runtime/core/error.h"
#include "runtime/device/device.h"
#include "runtime/device/ops.h"

using namespace strata;
using namespace strata::device;
using namespace std::chrono_literals;

namespace {

std::unique_ptr<Device> make(Backend b) {
  DeviceOptions o;
  o.backend = b;
  o.budget_bytes = 64 << 20;
  o.pinned_budget_bytes = 64 << 20;
  return Device::create(o);
}

// A gate a host task blocks on, so a test can hold a stream busy.
struct Gate {
  std::promise<void> p;
  std::shared_future<void> f = p.get_future().share();
  void open() { p.set_value(); }
};

}  // namespace

#define CONTRACT_TEST(title, fn)                                          \
  static void fn(Backend backend);                                        \
  TEST_CASE(title " (host)", "[device][contract]") { fn(Backend::host); } \
  TEST_CASE(title " (cuda)", "[cuda][contract]") { fn(Backend::cuda); }   \
  static void fn(Backend backend)

CONTRACT_TEST("work on one stream runs in submission order", order_in_stream) {
  auto dev = make(backend);
  auto s = dev->create_stream();
  constexpr std::size_t n = 1 << 20;
  PinnedBuffer h(*dev, n), back(*dev, n);
  DeviceBuffer d(*dev, n), d2(*dev, n);
  std::vector<int> seen;
  for (int round = 0; round < 4; ++round) {
    s->launch_host([&, round] {
      std::memset(h.get(), round + 1, n);
      seen.push_back(round);
    });
    s->copy_async(d.get(), h.get(), n, CopyKind::host_to_device);
    s->copy_async(d2.get(), d.get(), n, CopyKind::device_to_device);
    s->copy_async(back.get(), d2.get(), n, CopyKind::device_to_host);
    s->launch_host([&, round] {
      const auto* b = back.as<unsigned char>();
      if (b[0] != round + 1 || b[n - 1] != round + 1) throw Error(Errc::internal, "copy out of order");
      seen.push_back(100 + round);
    });
  }
  s->synchronize();
  CHECK(seen == std::vector<int>{0, 100, 1, 101, 2, 102, 3, 103});
  s->memset_async(d.get(), 0x5A, n);
  s->copy_async(back.get(), d.get(), n, CopyKind::device_to_host);
  s->synchronize();
  CHECK(back.as<unsigned char>()[n / 2] == 0x5A);
}

CONTRACT_TEST("a stream waiting on an event runs after the recorded work, without blocking the caller", cross_stream) {
  auto dev = make(backend);
  auto s1 = dev->create_stream(), s2 = dev->create_stream();
  auto e = dev->create_event();
  Gate gate;
  std::atomic<int> stage{0};
  int observed = -1;
  s1->launch_host([&] {
    gate.f.wait();
    stage = 1;
  });
  s1->record(*e);
  s2->wait(*e);  // returns at once
  s2->launch_host([&] { observed = stage.load(); });
  std::this_thread::sleep_for(20ms);
  CHECK_FALSE(s2->query());
  CHECK_FALSE(e->query());  // recorded before the work it captures completed
  gate.open();
  s2->synchronize();
  CHECK(observed == 1);
  CHECK(e->query());
}

CONTRACT_TEST("an event never recorded is complete and waiting on it is a no-op", unrecorded_event) {
  auto dev = make(backend);
  auto s = dev->create_stream();
  auto e = dev->create_event();
  CHECK(e->query());
  e->synchronize();
  s->wait(*e);
  s->synchronize();
  CHECK(s->query());
}

CONTRACT_TEST("re-recording an event does not release waiters of the earlier record", rerecord) {
  auto dev = make(backend);
  auto busy = dev->create_stream(), waiter = dev->create_stream(), idle = dev->create_stream();
  auto e = dev->create_event();
  Gate gate;
  std::atomic<bool> released{false};
  bool saw_release = false;
  busy->launch_host([&] {
    gate.f.wait();
    released = true;
  });
  busy->record(*e);
  waiter->wait(*e);  // captures the record on `busy`
  waiter->launch_host([&] { saw_release = released.load(); });
  idle->record(*e);  // a new record completes at once
  e->synchronize();
  std::this_thread::sleep_for(20ms);
  CHECK_FALSE(waiter->query());
  gate.open();
  waiter->synchronize();
  CHECK(saw_release);
  busy->synchronize();
}

CONTRACT_TEST("an exception in stream work is sticky and reported by synchronize", sticky_error) {
  auto dev = make(backend);
  auto s = dev->create_stream();
  auto e = dev->create_event();
  bool ran_after = false;
  s->launch_host([] { throw Error(Errc::internal, "layer 7 forward failed"); });
  s->launch_host([&] { ran_after = true; });
  s->record(*e);
  e->synchronize();  // event marks still complete, so nobody hangs on a failed stream
  CHECK_THROWS_WITH(s->synchronize(), Catch::Contains("layer 7 forward failed"));
  CHECK_THROWS_WITH(s->synchronize(), Catch::Contains("layer 7 forward failed"));
  CHECK_FALSE(ran_after);
}

CONTRACT_TEST("stream-ordered memory returns to the budget when the stream reaches the free", stream_ordered_alloc) {
  auto dev = make(backend);
  auto s = dev->create_stream();
  PinnedBuffer out(*dev, 4096);
  void* p = dev->allocate_async(4096, *s, "activation");
  CHECK(dev->memory_stats().used_bytes >= 4096);
  s->memset_async(p, 7, 4096);
  s->copy_async(out.get(), p, 4096, CopyKind::device_to_host);
  dev->free_async(p, *s);
  s->synchronize();
  CHECK(out.as<unsigned char>()[4095] == 7);
  CHECK(dev->memory_stats().used_bytes == 0);
  CHECK(dev->memory_stats().allocations == 0);
}

CONTRACT_TEST("events measure elapsed time between records", elapsed) {
  auto dev = make(backend);
  auto s = dev->create_stream();
  auto a = dev->create_event(), b = dev->create_event();
  s->record(*a);
  s->launch_host([] { std::this_thread::sleep_for(30ms); });
  s->record(*b);
  b->synchronize();
  a->synchronize();
  CHECK(a->elapsed_ms(*b) >= 25.0);
  CHECK(a->elapsed_ms(*b) < 1000.0);
}

CONTRACT_TEST("a stream waits for a host signal without blocking the caller", host_signal_wait) {
  auto dev = make(backend);
  auto s = dev->create_stream();
  auto signal = dev->create_host_signal();
  CHECK(signal->value() == 0);
  constexpr std::size_t n = 1 << 16;
  PinnedBuffer h(*dev, n), back(*dev, n);
  DeviceBuffer d(*dev, n);
  std::memset(h.get(), 0, n);
  std::memset(back.get(), 0xff, n);
  const auto t0 = std::chrono::steady_clock::now();
  s->wait(*signal, 2);
  s->copy_async(d.get(), h.get(), n, CopyKind::host_to_device);
  s->copy_async(back.get(), d.get(), n, CopyKind::device_to_host);
  auto done = dev->create_event();
  s->record(*done);
  CHECK(std::chrono::steady_clock::now() - t0 < 1s);  // the caller went on
  signal->raise(1);                                   // below the value waited for
  std::this_thread::sleep_for(50ms);
  CHECK_FALSE(done->query());
  std::memset(h.get(), 7, n);  // what the host produces before it raises the signal
  signal->raise(2);
  done->synchronize();
  CHECK(signal->value() == 2);
  const auto* b = back.as<unsigned char>();
  CHECK(std::all_of(b, b + n, [](unsigned char c) { return c == 7; }));
}

CONTRACT_TEST("host signal values are compared modulo 2^32", host_signal_wrap) {
  STATIC_REQUIRE(signal_reached(5, 5));
  STATIC_REQUIRE(signal_reached(0x10, 0xfffffff0u));  // 0x20 past it, across the wrap
  STATIC_REQUIRE_FALSE(signal_reached(0xffffffffu, 0x10));
  auto dev = make(backend);
  auto s = dev->create_stream();
  auto signal = dev->create_host_signal();
  signal->raise(0xfffffff0u);
  s->wait(*signal, 0x10);
  auto done = dev->create_event();
  s->record(*done);
  signal->raise(0xffffffffu);
  std::this_thread::sleep_for(50ms);
  CHECK_FALSE(done->query());
  signal->raise(0x10);
  done->synchronize();
  // A value already reached releases at once.
  s->wait(*signal, 0x08);
  s->record(*done);
  done->synchronize();
}

CONTRACT_TEST("device-side dtype conversion matches the host conversion bit for bit", device_convert) {
  auto dev = make(backend);
  auto s = dev->create_stream();
  constexpr std::size_t n = 100003;
  std::vector<float> x(n);
  std::uint32_t state = 12345;
  for (auto& v : x) {
    state = state * 1664525u + 1013904223u;
    v = static_cast<float>(static_cast<std::int32_t>(state)) * 1e-6f;
  }
  x[0] = 464.0f;  // e4m3 tie at the top
  x[1] = 1e-8f;   // subnormal in fp16
  for (DType t : {DType::bf16, DType::fp16, DType::fp8_e4m3, DType::fp8_e5m2}) {
    INFO(dtype_name(t));
    const std::size_t bytes = n * dtype_size(t);
    PinnedBuffer in(*dev, n * 4), out(*dev, bytes), round(*dev, n * 4);
    DeviceBuffer din(*dev, n * 4), dout(*dev, bytes), dround(*dev, n * 4);
    std::memcpy(in.get(), x.data(), n * 4);
    s->copy_async(din.get(), in.get(), n * 4, CopyKind::host_to_device);
    convert_async(*s, din.get(), DType::fp32, dout.get(), t, n);
    convert_async(*s, dout.get(), t, dround.get(), DType::fp32, n);
    s->copy_async(out.get(), dout.get(), bytes, CopyKind::device_to_host);
    s->copy_async(round.get(), dround.get(), n * 4, CopyKind::device_to_host);
    s->synchronize();
    std::vector<std::uint8_t> want(bytes);
    convert(x.data(), DType::fp32, want.data(), t, n);
    CHECK(std::memcmp(want.data(), out.get(), bytes) == 0);
    std::vector<float> want_round(n);
    convert(want.data(), t, want_round.data(), DType::fp32, n);
    CHECK(std::memcmp(want_round.data(), round.get(), n * 4) == 0);
  }
}

CONTRACT_TEST("device-side accumulation adds the widened source with one fp32 rounding", device_accumulate) {
  auto dev = make(backend);
  auto s = dev->create_stream();
  constexpr std::size_t n = 100003;  // not a multiple of the host's 4096-element blocks
  std::vector<float> acc0(n), x(n);
  std::uint32_t state = 777;
  auto next = [&state] {
    state = state * 1664525u + 1013904223u;
    return static_cast<float>(static_cast<std::int32_t>(state)) * 1e-9f;  // |v| < ~2.2: exact double sums
  };
  for (std::size_t i = 0; i < n; ++i) {
    acc0[i] = next();
    x[i] = next() * (i % 3 == 0 ? 1e-3f : 1.0f);
  }
  for (DType t : {DType::fp32, DType::bf16, DType::fp16}) {
    INFO(dtype_name(t));
    const std::size_t bytes = n * dtype_size(t);
    std::vector<std::uint8_t> src(bytes);
    convert(x.data(), DType::fp32, src.data(), t, n);
    std::vector<float> wide(n);
    convert(src.data(), t, wide.data(), DType::fp32, n);
    PinnedBuffer hacc(*dev, n * 4), hsrc(*dev, bytes);
    DeviceBuffer dacc(*dev, n * 4), dsrc(*dev, bytes);
    std::memcpy(hacc.get(), acc0.data(), n * 4);
    std::memcpy(hsrc.get(), src.data(), bytes);
    s->copy_async(dacc.get(), hacc.get(), n * 4, CopyKind::host_to_device);
    s->copy_async(dsrc.get(), hsrc.get(), bytes, CopyKind::host_to_device);
    accumulate_async(*s, dacc.as<float>(), dsrc.get(), t, n);
    accumulate_async(*s, dacc.as<float>(), dsrc.get(), t, n);  // twice: acc + w + w
    s->copy_async(hacc.get(), dacc.get(), n * 4, CopyKind::device_to_host);
    s->synchronize();
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < n; ++i) {
      // The sum of two such floats is exact in double: rounding it once is the fp32 add.
      const float once = static_cast<float>(static_cast<double>(acc0[i]) + static_cast<double>(wide[i]));
      const float twice = static_cast<float>(static_cast<double>(once) + static_cast<double>(wide[i]));
      wrong += std::memcmp(&twice, hacc.as<float>() + i, 4) != 0;
    }
    CHECK(wrong == 0);
  }
  CHECK_THROWS_WITH(accumulate_async(*s, nullptr, nullptr, DType::fp8_e4m3, 4),
                    Catch::Contains("fp8_e4m3") && Catch::Contains("fp32, bf16 or fp16"));
}
