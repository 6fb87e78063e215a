// The host backend's link throttle: the fastest of five copies runs within 10% of the
// configured bandwidth (so none runs faster), and two streams sharing a direction share its
// bandwidth (the link is serialised), while the two directions run in parallel like
// full-duplex PCIe. Each check holds the fastest of five runs: ctest runs suites side by
// side, and a busy machine can only delay a copy, never speed it up.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include <catch2/catch.hpp>

#include "runtime/core/stats.h"
#include "runtime/device/device.h"

using namespace strata;
using namespace strata::device;
using Clock = std::chrono::steady_clock;

namespace {
std::unique_ptr<Device> throttled(double gbps, std::size_t bytes) {
  DeviceOptions o;
  o.budget_bytes = 2 * bytes + (1 << 20);
  o.pinned_budget_bytes = 2 * bytes + (1 << 20);
  o.link_gbps = gbps;
  return Device::create(o);
}
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
}  // namespace

TEST_CASE("throttled copies run within 10% of the configured bandwidth", "[device][throttle]") {
  const double gbps = GENERATE(1.0, 4.0);
  constexpr std::size_t bytes = 64 << 20;
  auto dev = throttled(gbps, bytes);
  PinnedBuffer h(*dev, bytes);
  DeviceBuffer d(*dev, bytes);
  std::memset(h.get(), 1, bytes);
  auto s = dev->create_stream();
  std::vector<double> h2d, d2h;
  for (int i = 0; i < 5; ++i) {
    auto t0 = Clock::now();
    s->copy_async(d.get(), h.get(), bytes, CopyKind::host_to_device);
    s->synchronize();
    h2d.push_back(bytes / seconds_since(t0) / 1e9);
    t0 = Clock::now();
    s->copy_async(h.get(), d.get(), bytes, CopyKind::device_to_host);
    s->synchronize();
    d2h.push_back(bytes / seconds_since(t0) / 1e9);
  }
  const double h2d_best = *std::max_element(h2d.begin(), h2d.end()),
               d2h_best = *std::max_element(d2h.begin(), d2h.end());
  INFO("link " << gbps << " GB/s: H2D median " << median(h2d) << ", best " << h2d_best << "; D2H median " << median(d2h)
               << ", best " << d2h_best);
  CHECK(h2d_best == Approx(gbps).epsilon(0.10));
  CHECK(d2h_best == Approx(gbps).epsilon(0.10));
}

TEST_CASE("streams share a direction's bandwidth; opposite directions overlap", "[device][throttle]") {
  constexpr double gbps = 2.0;
  constexpr std::size_t bytes = 96 << 20;
  const double one_copy_s = bytes / (gbps * 1e9);
  auto dev = throttled(gbps, 2 * bytes);
  PinnedBuffer h(*dev, 2 * bytes);
  DeviceBuffer d(*dev, 2 * bytes);
  auto s1 = dev->create_stream(), s2 = dev->create_stream();
  auto* hp = h.as<unsigned char>();
  auto* dp = d.as<unsigned char>();
  // Touch every page first: page faults are not link time.
  std::memset(hp, 1, 2 * bytes);
  std::memset(dp, 2, 2 * bytes);
  std::vector<double> same_dir, both_dirs;
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = Clock::now();
    s1->copy_async(dp, hp, bytes, CopyKind::host_to_device);
    s2->copy_async(dp + bytes, hp + bytes, bytes, CopyKind::host_to_device);
    s1->synchronize();
    s2->synchronize();
    same_dir.push_back(seconds_since(t0));
    t0 = Clock::now();
    s1->copy_async(dp, hp, bytes, CopyKind::host_to_device);
    s2->copy_async(hp + bytes, dp + bytes, bytes, CopyKind::device_to_host);
    s1->synchronize();
    s2->synchronize();
    both_dirs.push_back(seconds_since(t0));
  }
  const double same_best = *std::min_element(same_dir.begin(), same_dir.end()),
               both_best = *std::min_element(both_dirs.begin(), both_dirs.end());
  INFO("one copy " << one_copy_s << " s; same direction median " << median(same_dir) << ", best " << same_best
                   << "; both directions median " << median(both_dirs) << ", best " << both_best);
  CHECK(same_best == Approx(2 * one_copy_s).epsilon(0.10));
  CHECK(both_best == Approx(one_copy_s).epsilon(0.10));
}
