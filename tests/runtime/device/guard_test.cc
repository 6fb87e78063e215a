// The host device's guard_memory ([pku]: skipped where the CPU or kernel has no memory
// protection keys): device memory is reachable from stream work and CpuAccessScope only,
// as a GPU's is from kernels and copies; any other CPU access ends the process.
#include <csignal>
#include <cstring>
#include <vector>

#include <catch2/catch.hpp>

#include "runtime/core/dtype.h"
#include "runtime/device/device.h"
#include "runtime/device/ops.h"
#include "tests/support/child.h"

using namespace strata;
using namespace strata::device;

namespace {

std::unique_ptr<Device> guarded(std::uint64_t budget = 64 << 20) {
  DeviceOptions o;
  o.budget_bytes = budget;
  o.pinned_budget_bytes = 64 << 20;
  o.guard_memory = true;
  return Device::create(o);
}

}  // namespace

TEST_CASE("a guarded host device serves stream work and CpuAccessScope", "[device][pku]") {
  auto dev = guarded();
  CHECK(dev->name().find("memory guarded") != std::string::npos);
  auto s = dev->create_stream();
  // Large enough that convert() would go parallel: the stream runs it on its worker alone.
  constexpr std::size_t n = std::size_t{1} << 22;
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<float>(i % 1000) * 0.25f;
  DeviceBuffer d32(*dev, n * 4), d16(*dev, n * 2);
  std::vector<std::uint16_t> back(n);
  s->memset_async(d32.get(), 0, n * 4);
  s->copy_async(d32.get(), x.data(), n * 4, CopyKind::host_to_device);
  convert_async(*s, d32.get(), DType::fp32, d16.get(), DType::bf16, n);
  s->copy_async(back.data(), d16.get(), n * 2, CopyKind::device_to_host);
  s->synchronize();
  std::vector<std::uint16_t> want(n);
  convert(x.data(), DType::fp32, want.data(), DType::bf16, n);
  CHECK(std::memcmp(want.data(), back.data(), n * 2) == 0);
  {
    CpuAccessScope scope(*dev);
    CHECK(d32.as<float>()[12345] == x[12345]);
    d32.as<float>()[0] = 7.0f;
  }
  float first = 0;
  s->copy_async(&first, d32.get(), 4, CopyKind::device_to_host);
  s->synchronize();
  CHECK(first == 7.0f);
  CHECK(dev->set_cpu_access(false) == false);  // outside the scope: no access, as before it
}

TEST_CASE("a guarded host device stops a CPU access outside stream work", "[device][pku]") {
  // In a child process: the access must end it with SIGSEGV, and the same access inside a
  // CpuAccessScope must not.
  for (bool scoped : {false, true}) {
    INFO((scoped ? "inside a CpuAccessScope" : "outside"));
    const auto r = test::run_in_child([scoped]() -> std::string {
      auto dev = guarded(1 << 20);
      DeviceBuffer b(*dev, 4096);
      if (scoped) {
        CpuAccessScope scope(*dev);
        std::memset(b.get(), 1, 4096);
      } else {
        std::memset(b.get(), 1, 4096);
      }
      return "touched";
    });
    if (scoped) {
      CHECK(r.exit_code == 0);
      CHECK(r.output == "touched");
    } else {
      CHECK(r.exit_code == -1);
      CHECK(r.signal == SIGSEGV);
    }
  }
}
