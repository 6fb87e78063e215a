// Backend dispatch for device-side operations (see ops.h).
#include "runtime/device/ops.h"

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
  stream.launch_host([=] {
    // Widened a block at a time (exact), then added: the CUDA kernel's arithmetic.
    constexpr std::size_t kBlock = 4096;
    float wide[kBlock];
    const std::size_t esize = dtype_size(src_dtype);
    for (std::size_t i0 = 0; i0 < count; i0 += kBlock) {
      const std::size_t n = std::min(kBlock, count - i0);
      const float* w = static_cast<const float*>(src) + i0;
      if (src_dtype != DType::fp32) {
        convert(static_cast<const char*>(src) + i0 * esize, src_dtype, wide, DType::fp32, n);
        w = wide;
      }
      for (std::size_t i = 0; i < n; ++i) acc[i0 + i] += w[i];
    }
  });
}

}  // namespace strata::device
