// Backend dispatch for device-side operations (see ops.h).
#include "runtime/device/ops.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>

#include "runtime/core/error.h"

namespace strata::device {

void convert_async(Stream& stream, const void* src, DType from, void* dst, DType to, std::size_t count,
                   ConvertOptions options) {
  if (stream.backend() == Backend::cuda) {
    detail::cuda_convert_async(stream.native_handle(), src, from, dst, to, count, options.saturate_fp8);
    return;
  }
  stream.launch_host([=] { convert(src, from, dst, to, count, options); });
}

void accumulate_async(Stream& stream, float* acc, const void* src, DType src_dtype, std::size_t count) {
  STRATA_CHECK(src_dtype == DType::fp32 || src_dtype == DType::bf16 || src_dtype == DType::fp16, Errc::invalid_argument,
               "accumulate_async: source dtype ", dtype_name(src_dtype), " is not supported: use fp32, bf16 or fp16");
  if (count == 0) return;
  if (stream.backend() == Backend::cuda) {
    detail::cuda_accumulate_async(stream.native_handle(), acc, src, src_dtype, count);
    return;
  }
  stream.launch_host([=] { accumulate_host(acc, src, src_dtype, count); });
}

// Widened a block at a time (exact), then added: the CUDA kernel's arithmetic.
void accumulate_host(void* acc, DType acc_dtype, const void* src, DType src_dtype, std::size_t count) {
  constexpr std::size_t kBlock = 4096;
  const std::size_t esize = dtype_size(src_dtype), asize = dtype_size(acc_dtype);
  const auto blocks = [&](std::size_t b0, std::size_t b1) {
    float wide[kBlock], sum[kBlock];
    for (std::size_t i0 = b0 * kBlock; i0 < std::min(count, b1 * kBlock); i0 += kBlock) {
      const std::size_t n = std::min(kBlock, count - i0);
      const float* w = static_cast<const float*>(src) + i0;
      if (src_dtype != DType::fp32) {
        convert(static_cast<const char*>(src) + i0 * esize, src_dtype, wide, DType::fp32, n);
        w = wide;
      }
      char* at = static_cast<char*>(acc) + i0 * asize;
      float* a = acc_dtype == DType::fp32 ? reinterpret_cast<float*>(at) : sum;
      if (acc_dtype != DType::fp32) convert(at, acc_dtype, sum, DType::fp32, n);
      for (std::size_t i = 0; i < n; ++i) a[i] += w[i];
      if (acc_dtype != DType::fp32) convert(sum, DType::fp32, at, acc_dtype, n);
    }
  };
  // Split over TBB's workers from 2^20 elements, as strata::convert is (smaller buffers are
  // not worth waking them).
  const std::size_t nblocks = (count + kBlock - 1) / kBlock;
  if (count < (std::size_t{1} << 20)) {
    blocks(0, nblocks);
    return;
  }
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, nblocks, 16),
                    [&](const tbb::blocked_range<std::size_t>& r) { blocks(r.begin(), r.end()); });
}

}  // namespace strata::device
