// device::accumulate_host over TBB's workers (buffers of 2^20 elements and more) gives, element
// for element, the serial rule: widen the source, add in fp32, and for a 16-bit accumulator
// widen before and narrow after with strata::convert's rounding. Tagged [tbb]: ThreadSanitizer
// cannot see libtbb's own synchronization, so it runs in the plain and ASan builds.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <vector>

#include "runtime/core/dtype.h"
#include "runtime/device/ops.h"

using namespace strata;

TEST_CASE("accumulate_host split over TBB's workers gives the serial rule's bits", "[device][tbb]") {
  const std::size_t n = (std::size_t{1} << 20) + 4099;  // parallel, with a partial last block
  std::uint32_t state = 99;
  auto next = [&state] {
    state = state * 1664525u + 1013904223u;
    return static_cast<float>(static_cast<std::int32_t>(state)) * 1e-9f;
  };
  std::vector<float> x(n), acc0(n);
  for (std::size_t i = 0; i < n; ++i) {
    acc0[i] = next();
    x[i] = next() * (i % 5 == 0 ? 1e-4f : 1.0f);
  }
  for (DType acc_t : {DType::fp32, DType::bf16, DType::fp16}) {
    for (DType src_t : {DType::fp32, DType::bf16, DType::fp16}) {
      INFO("accumulator " << dtype_name(acc_t) << ", source " << dtype_name(src_t));
      std::vector<std::uint8_t> src(n * dtype_size(src_t)), acc(n * dtype_size(acc_t));
      convert(x.data(), DType::fp32, src.data(), src_t, n);
      convert(acc0.data(), DType::fp32, acc.data(), acc_t, n);
      std::vector<std::uint8_t> want = acc;
      for (std::size_t i = 0; i < n; ++i) {  // one element at a time
        float a = 0, w = 0;
        convert(want.data() + i * dtype_size(acc_t), acc_t, &a, DType::fp32, 1);
        convert(src.data() + i * dtype_size(src_t), src_t, &w, DType::fp32, 1);
        a += w;
        convert(&a, DType::fp32, want.data() + i * dtype_size(acc_t), acc_t, 1);
      }
      device::accumulate_host(acc.data(), acc_t, src.data(), src_t, n);
      CHECK(std::memcmp(acc.data(), want.data(), acc.size()) == 0);
    }
  }
}
