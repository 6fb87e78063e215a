// The CUDA Adam/AdamW kernel: the CPU kernel's arithmetic (detail/update_scalars.h) written
// with explicitly rounded intrinsics (__fmaf_rn, __fmul_rn, __fdiv_rn, __fsqrt_rn), so nvcc's
// contraction and fast-math settings cannot change it. One element per thread, grid-stride.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "optim/detail/cuda_launch.h"
#include "runtime/core/error.h"
#include "runtime/device/cuda_check.h"

namespace strata::optim::detail {
namespace {

__device__ __forceinline__ float load(const void* base, DType t, std::size_t i) {
  switch (t) {
    case DType::bf16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
    case DType::fp16:
      return __half2float(static_cast<const __half*>(base)[i]);
    default:
      return static_cast<const float*>(base)[i];
  }
}

__device__ __forceinline__ void store(void* base, DType t, std::size_t i, float x) {
  switch (t) {
    case DType::bf16:
      static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(x);
      break;
    case DType::fp16:
      static_cast<__half*>(base)[i] = __float2half_rn(x);
      break;
    default:
      static_cast<float*>(base)[i] = x;
      break;
  }
}

__global__ void adam_kernel(AdamScalars s, float* master, const void* grad, DType grad_dtype, void* m, void* v,
                            DType state_dtype, void* copy, DType copy_dtype, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    float p = master[i];
    float g = __fmul_rn(load(grad, grad_dtype, i), s.grad_scale);
    if (s.l2) g = __fmaf_rn(p, s.l2_decay, g);
    const float mm = __fmaf_rn(s.beta1, load(m, state_dtype, i), __fmul_rn(s.one_minus_beta1, g));
    const float vv = __fmaf_rn(s.beta2, load(v, state_dtype, i), __fmul_rn(s.one_minus_beta2, __fmul_rn(g, g)));
    const float d = __fmaf_rn(__fsqrt_rn(vv), s.inv_sqrt_bc2, s.eps);
    p = __fmaf_rn(__fdiv_rn(mm, d), s.neg_step_size, __fmul_rn(p, s.decay));
    master[i] = p;
    store(m, state_dtype, i, mm);
    store(v, state_dtype, i, vv);
    if (copy) store(copy, copy_dtype, i, p);
  }
}

}  // namespace

void cuda_adam_step_async(void* cuda_stream, const AdamScalars& s, const StepArgs& a) {
  if (a.n == 0) return;
  constexpr int kThreads = 256;
  const std::size_t needed = (a.n + kThreads - 1) / kThreads;
  const int blocks = static_cast<int>(needed < 65535 ? needed : 65535);
  adam_kernel<<<blocks, kThreads, 0, static_cast<cudaStream_t>(cuda_stream)>>>(
      s, a.master, a.grad, a.grad_dtype, a.m, a.v, a.state_dtype, a.copy, a.copy_dtype, a.n);
  STRATA_CUDA_CHECK(cudaGetLastError(), "adam step kernel launch (", a.n, " elements)");
}

}  // namespace strata::optim::detail
