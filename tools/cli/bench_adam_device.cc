// The device form of `strata bench adam` (bench_adam_device.h).
#include "tools/cli/bench_adam_device.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <optional>
#include <vector>

#include "optim/device_step.h"
#include "optim/roofline.h"
#include "runtime/core/error.h"
#include "runtime/core/stats.h"
#include "runtime/core/units.h"
#include "runtime/device/device.h"

namespace strata::cli {

void fill_uniform(void* dst, DType t, std::size_t n, std::uint64_t seed, float lo, float hi) {
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, n, std::size_t{1} << 16), [&](const auto& r) {
    constexpr std::size_t kChunk = 4096;
    float tmp[kChunk];
    for (std::size_t i = r.begin(); i < r.end(); i += kChunk) {
      const std::size_t len = std::min(kChunk, r.end() - i);
      for (std::size_t k = 0; k < len; ++k) {
        std::uint64_t z = (i + k) * 0x9E3779B97F4A7C15ull + seed;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        tmp[k] = lo + (hi - lo) * static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
      }
      convert(tmp, DType::fp32, static_cast<unsigned char*>(dst) + i * dtype_size(t), t, len);
    }
  });
}

void fill_moments(void* dst, MomentFormat f, Moment which, std::size_t n, std::uint64_t seed, float lo, float hi) {
  if (f != MomentFormat::q8) {
    fill_uniform(dst, f == MomentFormat::bf16 ? DType::bf16 : DType::fp32, n, seed, lo, hi);
    return;
  }
  std::vector<float> tmp(n);
  fill_uniform(tmp.data(), DType::fp32, n, seed, lo, hi);
  moments_from_fp32(tmp.data(), dst, f, which, n);
}

namespace {

using Clock = std::chrono::steady_clock;

// A device buffer of n elements of t holding fill_uniform's values, uploaded in one copy.
device::DeviceBuffer filled(device::Device& dev, device::Stream& s, DType t, std::size_t n, std::uint64_t seed,
                            float lo, float hi, const char* what) {
  device::DeviceBuffer b(dev, n * dtype_size(t), what);
  std::vector<unsigned char> host(n * dtype_size(t));
  fill_uniform(host.data(), t, n, seed, lo, hi);
  s.copy_async(b.get(), host.data(), host.size(), device::CopyKind::host_to_device);
  s.synchronize();
  return b;
}

// The same for moments of format f.
device::DeviceBuffer filled_moments(device::Device& dev, device::Stream& s, MomentFormat f, Moment which, std::size_t n,
                                    std::uint64_t seed, float lo, float hi, const char* what) {
  device::DeviceBuffer b(dev, moment_bytes(f, n), what);
  std::vector<unsigned char> host(moment_bytes(f, n));
  fill_moments(host.data(), f, which, n, seed, lo, hi);
  s.copy_async(b.get(), host.data(), host.size(), device::CopyKind::host_to_device);
  s.synchronize();
  return b;
}

double seconds_of(device::Stream& s, const std::function<void()>& enqueue) {
  const auto t0 = Clock::now();
  enqueue();
  s.synchronize();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

nlohmann::json bench_adam_device(const std::string& name, const optim::AdamConfig& config, const optim::StepArgs& shape,
                                 bool copy_out, int iters) {
  optim::StepArgs a;
  a.n = shape.n;
  a.grad_dtype = shape.grad_dtype;
  a.state_format = shape.state_format;
  a.copy_dtype = shape.copy_dtype;
  const std::size_t n = a.n;
  // The roofline's copy reads and writes half the step's bytes each: the step reads master,
  // gradient and both moments and writes master, moments and the copy-out.
  const std::size_t moments = moment_bytes(a.state_format, n);
  const std::size_t half =
      (n * (2 * 4 + dtype_size(a.grad_dtype) + (copy_out ? dtype_size(a.copy_dtype) : 0)) + 4 * moments) / 2;
  const std::size_t state =
      n * (4 + dtype_size(a.grad_dtype) + (copy_out ? dtype_size(a.copy_dtype) : 0)) + 2 * moments;
  device::DeviceOptions opt;
  opt.backend = device::parse_backend(name);
  opt.budget_bytes = state + 2 * half + (std::uint64_t{64} << 20);
  opt.pinned_budget_bytes = std::uint64_t{64} << 20;
  auto dev = device::Device::create(opt);
  auto stream = dev->create_stream();
  auto& s = *stream;
  device::DeviceBuffer master = filled(*dev, s, DType::fp32, n, 1, -0.05f, 0.05f, "bench adam master");
  device::DeviceBuffer grad = filled(*dev, s, a.grad_dtype, n, 2, -1e-3f, 1e-3f, "bench adam gradient");
  device::DeviceBuffer m = filled_moments(*dev, s, a.state_format, Moment::first, n, 3, -1e-4f, 1e-4f, "bench adam m");
  device::DeviceBuffer v = filled_moments(*dev, s, a.state_format, Moment::second, n, 4, 0.0f, 1e-6f, "bench adam v");
  std::optional<device::DeviceBuffer> copy;
  if (copy_out) copy.emplace(*dev, n * dtype_size(a.copy_dtype), "bench adam copy-out");
  const std::size_t copy_bytes = opt.backend == device::Backend::host ? 1 : half;
  device::DeviceBuffer from(*dev, copy_bytes, "bench adam roofline source"),
      to(*dev, copy_bytes, "bench adam roofline target");
  a.master = master.as<float>();
  a.grad = grad.get();
  a.m = m.get();
  a.v = v.get();
  a.copy = copy ? copy->get() : nullptr;
  a.grad_scale = 0.5f;  // as if clipping: exercises the fused multiply
  a.step = 100;
  const auto step = [&] {
    optim::adam_step_async(s, config, a);
    ++a.step;
  };
  // On the host device the CPU step's own roofline (a threaded pass with the step's streams):
  // the arena's copy is one memcpy on the stream's worker, slower than the threaded step.
  const bool host = opt.backend == device::Backend::host;
  const auto roofline = [&] {
    if (host)
      s.launch_host([a] { optim::roofline_pass(optim::UpdateRule::adam, a); });
    else
      s.copy_async(to.get(), from.get(), half, device::CopyKind::device_to_device);
  };
  const optim::TrafficBytes traffic = optim::traffic_per_param(a, {true, true});
  STRATA_CHECK(n * traffic.total() / 2 == half, Errc::internal, "bench adam: roofline bytes");
  seconds_of(s, step);  // warm-up: kernels loaded, every page touched
  seconds_of(s, roofline);
  std::vector<double> t_step, t_roof, ratio;
  for (int i = 0; i < iters; ++i) {
    t_step.push_back(seconds_of(s, step));
    t_roof.push_back(seconds_of(s, roofline));
    ratio.push_back(t_roof.back() / t_step.back());
  }
  const double bytes = static_cast<double>(n) * static_cast<double>(traffic.total());
  const double step_s = median(t_step), roof_s = median(t_roof);
  return {{"optimizer", config.adamw_mode ? "adamw" : "adam"},
          {"device", dev->name()},
          {"backend", device::backend_name(opt.backend)},
          {"params", n},
          {"grad_dtype", dtype_name(a.grad_dtype)},
          {"state_dtype", moment_format_name(a.state_format)},
          {"copy_out", a.copy ? dtype_name(a.copy_dtype) : "none"},
          {"iters", iters},
          {"bytes_per_param", traffic.total()},
          {"step_ms", step_s * 1e3},
          {"gparams_per_s", static_cast<double>(n) / step_s / 1e9},
          {"gbps", bytes / step_s / 1e9},
          {"roofline", host ? "streaming pass with the step's traffic" : "device-to-device copy of the same bytes"},
          {"roofline_ms", roof_s * 1e3},
          {"roofline_gbps", bytes / roof_s / 1e9},
          {"fraction_of_roofline", median(ratio)}};
}

}  // namespace strata::cli
