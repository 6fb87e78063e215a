// Device-side operations every backend provides, enqueued on a Stream: dtype conversion of
// device buffers, and the fp32 accumulation of a (widened) buffer into another. Host backend: runs strata::convert on
// the stream's worker. CUDA: a kernel built on the CUDA toolkit's own conversion intrinsics (an independent
// implementation that the [cuda] tests compare bit for bit with the host one).
#pragma once

#include <cstddef>

#include "runtime/core/dtype.h"
#include "runtime/device/device.h"

namespace strata::device {

// One of `from`/`to` must be fp32 on the CUDA backend; any pair on the host backend.
void convert_async(Stream& stream, const void* src, DType from, void* dst, DType to, std::size_t count,
                   ConvertOptions options = {});

// acc[i] += float(src[i]) for i < count: src fp32, bf16 or fp16, widened exactly, then one
// fp32 addition (round to nearest even) per element: the same bits on every backend.
void accumulate_async(Stream& stream, float* acc, const void* src, DType src_dtype, std::size_t count);

// The same on the calling thread with TBB's workers, for host memory (stream host work that
// adds a copied-back gradient into a host accumulator): element-wise, so the same bits for
// any split. A 16-bit accumulator (acc_dtype bf16/fp16) is widened, added to in fp32 and
// narrowed back with strata::convert's rounding.
void accumulate_host(void* acc, DType acc_dtype, const void* src, DType src_dtype, std::size_t count);
inline void accumulate_host(float* acc, const void* src, DType src_dtype, std::size_t count) {
  accumulate_host(acc, DType::fp32, src, src_dtype, count);
}

namespace detail {
// Implemented in cuda_ops.cu, or by the stub when built without CUDA.
void cuda_convert_async(void* cuda_stream, const void* src, DType from, void* dst, DType to, std::size_t count,
                        bool saturate_fp8);
void cuda_accumulate_async(void* cuda_stream, float* acc, const void* src, DType src_dtype, std::size_t count);
}  // namespace detail

}  // namespace strata::device
