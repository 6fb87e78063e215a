// CUDA kernels behind ops.h: fp32 <-> bf16/fp16/fp8 conversion with the toolkit's
// round-to-nearest-even intrinsics (cuda_bf16.h, cuda_fp16.h, cuda_fp8.h), one element per
// thread in a grid-stride loop.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "runtime/core/error.h"
#include "runtime/device/cuda_check.h"
#include "runtime/device/ops.h"

namespace strata::device::detail {
namespace {

__device__ __forceinline__ float decode(const void* src, DType t, std::size_t i) {
  switch (t) {
    case DType::fp32:
      return static_cast<const float*>(src)[i];
    case DType::bf16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(src)[i]);
    case DType::fp16:
      return __half2float(static_cast<const __half*>(src)[i]);
    case DType::fp8_e4m3: {
      __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<const __nv_fp8_storage_t*>(src)[i], __NV_E4M3);
      return __half2float(__half(h));
    }
    case DType::fp8_e5m2: {
      __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<const __nv_fp8_storage_t*>(src)[i], __NV_E5M2);
      return __half2float(__half(h));
    }
  }
  return 0.0f;
}

__device__ __forceinline__ void encode(void* dst, DType t, std::size_t i, float v, bool saturate) {
  const __nv_saturation_t sat = saturate ? __NV_SATFINITE : __NV_NOSAT;
  switch (t) {
    case DType::fp32:
      static_cast<float*>(dst)[i] = v;
      break;
    case DType::bf16:
      static_cast<__nv_bfloat16*>(dst)[i] = __float2bfloat16_rn(v);
      break;
    case DType::fp16:
      static_cast<__half*>(dst)[i] = __float2half_rn(v);
      break;
    case DType::fp8_e4m3:
      static_cast<__nv_fp8_storage_t*>(dst)[i] = __nv_cvt_float_to_fp8(v, sat, __NV_E4M3);
      break;
    case DType::fp8_e5m2:
      static_cast<__nv_fp8_storage_t*>(dst)[i] = __nv_cvt_float_to_fp8(v, sat, __NV_E5M2);
      break;
  }
}

__global__ void convert_kernel(const void* src, DType from, void* dst, DType to, std::size_t n, bool saturate) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    encode(dst, to, i, decode(src, from, i), saturate);
  }
}

__global__ void accumulate_kernel(float* acc, const void* src, DType t, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    acc[i] = __fadd_rn(acc[i], decode(src, t, i));  // no contraction: one rounded add, as on the CPU
  }
}

int grid_for(std::size_t count, int threads) {
  const std::size_t blocks_needed = (count + threads - 1) / threads;
  return static_cast<int>(blocks_needed < 65535 ? blocks_needed : 65535);
}

}  // namespace

void cuda_convert_async(void* cuda_stream, const void* src, DType from, void* dst, DType to, std::size_t count,
                        bool saturate_fp8) {
  if (count == 0) return;
  STRATA_CHECK(from == DType::fp32 || to == DType::fp32, Errc::unsupported, "cuda convert_async from ",
               dtype_name(from), " to ", dtype_name(to), ": one side must be fp32");
  constexpr int kThreads = 256;
  const std::size_t blocks_needed = (count + kThreads - 1) / kThreads;
  const int blocks = static_cast<int>(blocks_needed < 65535 ? blocks_needed : 65535);
  convert_kernel<<<blocks, kThreads, 0, static_cast<cudaStream_t>(cuda_stream)>>>(src, from, dst, to, count,
                                                                                  saturate_fp8);
  STRATA_CUDA_CHECK(cudaGetLastError(), "convert_async kernel launch");
}

void cuda_accumulate_async(void* cuda_stream, float* acc, const void* src, DType src_dtype, std::size_t count) {
  if (count == 0) return;
  constexpr int kThreads = 256;
  accumulate_kernel<<<grid_for(count, kThreads), kThreads, 0, static_cast<cudaStream_t>(cuda_stream)>>>(
      acc, src, src_dtype, count);
  STRATA_CUDA_CHECK(cudaGetLastError(), "accumulate_async kernel launch");
}

}  // namespace strata::device::detail
