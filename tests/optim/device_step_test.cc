// The Stream-based entry points: on the host backend they run the CPU kernels in stream order
// and give the same bits as the direct calls; on a GPU ([cuda]) the CUDA kernels agree with
// the CPU kernels within the reference's fp32 rounding bounds.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "optim/device_step.h"
#include "runtime/device/device.h"
#include "tests/optim/check.h"

using namespace strata;
using namespace strata::test;

namespace {

// The shard's buffers mirrored in device memory.
struct DeviceShard {
  DeviceShard(device::Device& dev, const TestShard& sh) {
    const ShardSpec& s = sh.spec();
    const std::size_t n = sh.size();
    master = device::DeviceBuffer(dev, n * 4, "test master");
    grad = device::DeviceBuffer(dev, n * dtype_size(s.grad), "test grad");
    m = device::DeviceBuffer(dev, n * dtype_size(s.state), "test m");
    v = device::DeviceBuffer(dev, n * dtype_size(s.state), "test v");
    if (s.copy) copy = device::DeviceBuffer(dev, n * dtype_size(s.copy_dtype), "test copy");
  }
  void upload(device::Stream& s, TestShard& sh) {
    const auto a = sh.args(1);
    s.copy_async(master.get(), a.master, master.bytes(), device::CopyKind::host_to_device);
    s.copy_async(grad.get(), a.grad, grad.bytes(), device::CopyKind::host_to_device);
    s.copy_async(m.get(), a.m, m.bytes(), device::CopyKind::host_to_device);
    s.copy_async(v.get(), a.v, v.bytes(), device::CopyKind::host_to_device);
    if (a.copy) s.copy_async(copy.get(), a.copy, copy.bytes(), device::CopyKind::host_to_device);
    s.synchronize();
  }
  void download(device::Stream& s, TestShard& sh) {
    const auto a = sh.args(1);
    s.copy_async(a.master, master.get(), master.bytes(), device::CopyKind::device_to_host);
    s.copy_async(a.m, m.get(), m.bytes(), device::CopyKind::device_to_host);
    s.copy_async(a.v, v.get(), v.bytes(), device::CopyKind::device_to_host);
    if (a.copy) s.copy_async(a.copy, copy.get(), copy.bytes(), device::CopyKind::device_to_host);
    s.synchronize();
  }
  optim::StepArgs args(const optim::StepArgs& host) const {
    optim::StepArgs a = host;
    a.master = master.as<float>();
    a.grad = grad.get();
    a.m = m.get();
    a.v = v.get();
    a.copy = host.copy ? copy.get() : nullptr;
    return a;
  }
  device::DeviceBuffer master, grad, m, v, copy;
};

std::unique_ptr<device::Device> make_device(device::Backend b) {
  device::DeviceOptions o;
  o.backend = b;
  o.budget_bytes = std::uint64_t{256} << 20;
  o.pinned_budget_bytes = std::uint64_t{64} << 20;
  return device::Device::create(o);
}

}  // namespace

TEST_CASE("adam on a host-backend stream gives the direct call's bits", "[optim]") {
  auto dev = make_device(device::Backend::host);
  auto stream = dev->create_stream();
  TestShard direct(100003, {DType::bf16, DType::fp32, true, DType::bf16});
  std::mt19937 rng(53);
  direct.fill_params(rng);
  direct.fill_grads(rng);
  TestShard via = direct;
  DeviceShard d(*dev, via);
  d.upload(*stream, via);
  optim::AdamConfig c;
  for (std::int64_t step = 1; step <= 3; ++step) {
    optim::adam_step(c, direct.args(step, 0.5f));
    optim::adam_step_async(*stream, c, d.args(via.args(step, 0.5f)));
  }
  d.download(*stream, via);
  CHECK(via.snapshot() == direct.snapshot());
  const auto host_norm = optim::grad_norm_sq(direct.args(1).grad, DType::bf16, direct.size());
  const auto dev_norm = optim::grad_norm_sq(*dev, *stream, d.grad.get(), DType::bf16, direct.size());
  CHECK(dev_norm.sumsq == host_norm.sumsq);
}

TEST_CASE("the CUDA AdamW kernel matches the CPU kernel within fp32 rounding bounds", "[optim][cuda]") {
  const DType grad = GENERATE(DType::fp32, DType::bf16, DType::fp16);
  const DType state = GENERATE(DType::fp32, DType::bf16);
  const bool adamw = GENERATE(true, false);
  CAPTURE(dtype_name(grad), dtype_name(state), adamw);
  auto dev = make_device(device::Backend::cuda);
  auto stream = dev->create_stream();
  constexpr std::size_t n = 60007;  // 20 steps against a double reference in a few seconds
  TestShard cpu(n, {grad, state, true, DType::bf16});
  std::mt19937 rng(59);
  cpu.fill_params(rng);
  TestShard gpu = cpu;
  DeviceShard d(*dev, gpu);
  optim::AdamConfig c;
  c.lr = 1e-2f;
  c.weight_decay = 0.1f;
  c.adamw_mode = adamw;
  std::vector<RefElem> ref(n);
  for (std::int64_t step = 1; step <= 20; ++step) {
    cpu.fill_grads(rng);
    gpu = cpu;  // lockstep: both start every step from the same state
    d.upload(*stream, gpu);
    for (std::size_t i = 0; i < n; ++i) {
      ref[i] = cpu.elem(i);
      ref_adam(c, step, 0.5, cpu.grad(i), ref[i]);
    }
    optim::adam_step(c, cpu.args(step, 0.5f));
    optim::adam_step_async(*stream, c, d.args(gpu.args(step, 0.5f)));
    d.download(*stream, gpu);
    Mismatches bad_cpu, bad_gpu;
    compare(cpu, ref, {true, true}, bad_cpu);
    compare(gpu, ref, {true, true}, bad_gpu);
    INFO("step " << step << " cpu: " << bad_cpu.first << " gpu: " << bad_gpu.first);
    REQUIRE(bad_cpu.count == 0);
    REQUIRE(bad_gpu.count == 0);
  }
}

TEST_CASE("the CUDA gradient norm matches the CPU norm and detects NaN", "[optim][cuda]") {
  const DType t = GENERATE(DType::fp32, DType::bf16, DType::fp16);
  auto dev = make_device(device::Backend::cuda);
  auto stream = dev->create_stream();
  constexpr std::size_t n = (1 << 20) + 5;
  TestShard sh(n, {t, DType::fp32, false, DType::bf16});
  std::mt19937 rng(61);
  sh.fill_grads(rng, 1e-6, 10.0);
  DeviceShard d(*dev, sh);
  d.upload(*stream, sh);
  const auto cpu = optim::grad_norm_sq(sh.args(1).grad, t, n);
  const auto gpu = optim::grad_norm_sq(*dev, *stream, d.grad.get(), t, n);
  const auto again = optim::grad_norm_sq(*dev, *stream, d.grad.get(), t, n);
  CHECK(gpu.finite);
  CHECK(gpu.sumsq == again.sumsq);  // fixed order on the device too
  // Two summation orders of n non-negative terms: each within (n - 1) u of the exact sum.
  const double bound = 2.0 * static_cast<double>(n) * std::numeric_limits<double>::epsilon() / 2 * cpu.sumsq;
  CHECK(std::fabs(gpu.sumsq - cpu.sumsq) <= bound);
  sh.set_grad(n - 1, std::numeric_limits<float>::quiet_NaN());
  d.upload(*stream, sh);
  CHECK_FALSE(optim::grad_norm_sq(*dev, *stream, d.grad.get(), t, n).finite);
}
