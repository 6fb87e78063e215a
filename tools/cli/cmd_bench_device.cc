// `strata bench device`: H2D/D2H copy bandwidth through pinned memory and the stream/event
// round-trip latency. On the host backend it measures memcpy bandwidth unthrottled and,
// in the same run, with the link throttled to --link-gbps, reporting how close the
// throttle comes to its setting. Medians over --iters repetitions.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "runtime/core/error.h"
#include "runtime/core/stats.h"
#include "runtime/core/units.h"
#include "runtime/device/device.h"
#include "tools/cli/command.h"

namespace strata::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string device = "auto";
  std::string size = "256MiB";
  int iters = 7;
  double link_gbps = 4.0;
  bool json = false;
};

struct CopyFigures {
  double h2d_gbps = 0, d2h_gbps = 0;
};

CopyFigures measure_copies(device::Device& dev, std::size_t bytes, int iters) {
  device::PinnedBuffer host(dev, bytes, "bench host buffer");
  device::DeviceBuffer gpu(dev, bytes, "bench device buffer");
  auto* h = host.as<unsigned char>();
  for (std::size_t i = 0; i < bytes; ++i) h[i] = static_cast<unsigned char>(i * 131u + 7u);
  auto stream = dev.create_stream();
  auto time_copy = [&](void* dst, const void* src, device::CopyKind kind) {
    const auto t0 = Clock::now();
    stream->copy_async(dst, src, bytes, kind);
    stream->synchronize();
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  // Warm-up touches every page on both sides.
  time_copy(gpu.get(), host.get(), device::CopyKind::host_to_device);
  time_copy(host.get(), gpu.get(), device::CopyKind::device_to_host);
  std::vector<double> h2d, d2h;
  for (int i = 0; i < iters; ++i) {
    h2d.push_back(static_cast<double>(bytes) / time_copy(gpu.get(), host.get(), device::CopyKind::host_to_device) /
                  1e9);
    d2h.push_back(static_cast<double>(bytes) / time_copy(host.get(), gpu.get(), device::CopyKind::device_to_host) /
                  1e9);
  }
  return {median(h2d), median(d2h)};
}

struct LatencyFigures {
  double roundtrip_us = 0, cross_stream_us = 0;
};

LatencyFigures measure_events(device::Device& dev) {
  auto s1 = dev.create_stream();
  auto s2 = dev.create_stream();
  auto e1 = dev.create_event();
  auto e2 = dev.create_event();
  constexpr int kRounds = 2000;
  std::vector<double> rt, cross;
  for (int i = 0; i < kRounds; ++i) {
    const auto t0 = Clock::now();
    s1->record(*e1);
    e1->synchronize();
    const auto t1 = Clock::now();
    s1->record(*e1);
    s2->wait(*e1);
    s2->record(*e2);
    e2->synchronize();
    const auto t2 = Clock::now();
    rt.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    cross.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count());
  }
  return {median(rt), median(cross)};
}

Action setup(CLI::App& cmd) {
  auto o = std::make_shared<Options>();
  cmd.add_option("--device", o->device, "host|cuda|auto (auto: cuda when a GPU is present)");
  cmd.add_option("--size", o->size, "Bytes per copy (e.g. 256MiB)");
  cmd.add_option("--iters", o->iters, "Repetitions; figures are medians")->check(CLI::Range(1, 1000));
  cmd.add_option("--link-gbps", o->link_gbps, "Host backend: throttled run's link bandwidth in GB/s (0: skip)")
      ->check(CLI::NonNegativeNumber);
  cmd.add_flag("--json", o->json, "Print JSON");
  return [o] {
    const std::size_t bytes = parse_bytes(o->size, "--size");
    STRATA_CHECK(bytes > 0, Errc::invalid_argument, "--size must be > 0");
    device::DeviceOptions opt;
    opt.backend = o->device == "auto" ? device::default_backend() : device::parse_backend(o->device);
    opt.budget_bytes = bytes + (std::uint64_t{64} << 20);
    opt.pinned_budget_bytes = bytes + (std::uint64_t{64} << 20);
    auto dev = device::Device::create(opt);
    const CopyFigures raw = measure_copies(*dev, bytes, o->iters);
    const LatencyFigures lat = measure_events(*dev);
    nlohmann::json j = {{"device", dev->name()},
                        {"backend", device::backend_name(opt.backend)},
                        {"bytes", bytes},
                        {"iters", o->iters},
                        {"h2d_gbps", raw.h2d_gbps},
                        {"d2h_gbps", raw.d2h_gbps},
                        {"event_roundtrip_us", lat.roundtrip_us},
                        {"cross_stream_event_us", lat.cross_stream_us}};
    if (opt.backend == device::Backend::host && o->link_gbps > 0) {
      dev.reset();
      opt.link_gbps = o->link_gbps;
      auto throttled = device::Device::create(opt);
      const CopyFigures t = measure_copies(*throttled, bytes, o->iters);
      j["throttled"] = {{"link_gbps", o->link_gbps},
                        {"h2d_gbps", t.h2d_gbps},
                        {"d2h_gbps", t.d2h_gbps},
                        {"h2d_ratio", t.h2d_gbps / o->link_gbps},
                        {"d2h_ratio", t.d2h_gbps / o->link_gbps}};
    }
    if (o->json) {
      print_json(j.dump(2));
      return 0;
    }
    std::printf("device:            %s\n", j["device"].get<std::string>().c_str());
    std::printf("copy size:         %s, median of %d\n", format_bytes(bytes).c_str(), o->iters);
    std::printf("H2D (pinned):      %8.2f GB/s\n", raw.h2d_gbps);
    std::printf("D2H (pinned):      %8.2f GB/s\n", raw.d2h_gbps);
    std::printf("event round trip:  %8.2f us (record + synchronize)\n", lat.roundtrip_us);
    std::printf("cross-stream wait: %8.2f us (record, wait on another stream, record, synchronize)\n",
                lat.cross_stream_us);
    if (j.contains("throttled")) {
      const auto& t = j["throttled"];
      std::printf("throttled link %.2f GB/s: H2D %.3f GB/s (%.1f%%), D2H %.3f GB/s (%.1f%%)\n", o->link_gbps,
                  t["h2d_gbps"].get<double>(), 100 * t["h2d_ratio"].get<double>(), t["d2h_gbps"].get<double>(),
                  100 * t["d2h_ratio"].get<double>());
    }
    return 0;
  };
}

const Registration reg("bench", "device", "H2D/D2H bandwidth through pinned memory and event round-trip latency",
                       setup);

}  // namespace
}  // namespace strata::cli
