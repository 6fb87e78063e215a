// What the models' CUDA files (gpt/detail/gpt_cuda.cu, llama/detail/llama_cuda.cu) share:
// launch geometry (256 threads; one warp per row for row kernels; grid-stride loops capped at
// 65535 blocks), warp reductions in a fixed butterfly order, and the launch check. Included
// by .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "runtime/device/cuda_check.h"

namespace strata::model::detail {

inline cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

inline int blocks_for(std::size_t n, int threads) {
  const std::size_t b = (n + static_cast<std::size_t>(threads) - 1) / static_cast<std::size_t>(threads);
  return static_cast<int>(b < 65535 ? (b == 0 ? 1 : b) : 65535);
}

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// Column reductions: a block takes kTileCols columns; thread (x, y) sums rows y, y + kGroups,
// ... of column x, and the kGroups partials are added in y order: a fixed order for any
// row count.
constexpr int kTileCols = 32, kGroups = 32;

inline int row_blocks(int rows) { return (rows + kWarps - 1) / kWarps; }

inline void launched(const char* what) { STRATA_CUDA_CHECK(cudaGetLastError(), what, " kernel"); }

__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ inline double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ inline float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

}  // namespace strata::model::detail

#define STRATA_GRID_STRIDE(i, n)                                                                 \
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
