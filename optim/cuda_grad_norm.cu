// The CUDA gradient-norm pass: one thread block per kNormBlockElems elements, each thread
// squaring a fixed, strided subset in double, then a fixed shared-memory tree. The block
// partials go back to the host, which adds them in block order (device_step.cc), so the result
// is the same on every run; it differs from the CPU's only by summation order.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "optim/detail/cuda_launch.h"
#include "optim/grad_norm.h"
#include "runtime/core/error.h"
#include "runtime/device/cuda_check.h"

namespace strata::optim::detail {
namespace {

constexpr int kThreads = 256;
static_assert(kNormBlockElems % kThreads == 0, "each thread takes the same number of elements");

__device__ __forceinline__ double load(const void* base, DType t, std::size_t i) {
  switch (t) {
    case DType::bf16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
    case DType::fp16:
      return __half2float(static_cast<const __half*>(base)[i]);
    default:
      return static_cast<const float*>(base)[i];
  }
}

__global__ void norm_partials_kernel(const void* grad, DType dtype, std::size_t n, double* partials) {
  __shared__ double sums[kThreads];
  const std::size_t base = static_cast<std::size_t>(blockIdx.x) * kNormBlockElems;
  double acc = 0.0;
  for (std::size_t k = threadIdx.x; k < kNormBlockElems; k += kThreads) {
    const std::size_t i = base + k;
    if (i < n) {
      const double x = load(grad, dtype, i);
      acc = __dadd_rn(acc, __dmul_rn(x, x));  // the square of a float is exact in double
    }
  }
  sums[threadIdx.x] = acc;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half)
      sums[threadIdx.x] = __dadd_rn(sums[threadIdx.x], sums[threadIdx.x + half]);
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = sums[0];
}

}  // namespace

void cuda_grad_norm_partials_async(void* cuda_stream, const void* grad, DType dtype, std::size_t n, double* partials) {
  if (n == 0) return;
  const std::size_t blocks = (n + kNormBlockElems - 1) / kNormBlockElems;
  STRATA_CHECK(blocks <= 0x7fffffffu, Errc::invalid_argument, "grad norm: ", n, " elements is too many for one launch");
  norm_partials_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, static_cast<cudaStream_t>(cuda_stream)>>>(
      grad, dtype, n, partials);
  STRATA_CUDA_CHECK(cudaGetLastError(), "grad norm kernel launch (", n, " elements)");
}

}  // namespace strata::optim::detail
