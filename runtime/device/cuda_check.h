// STRATA_CUDA_CHECK: wraps a CUDA runtime call; on failure throws Errc::cuda with the
// expression, the runtime's error name and text, and the caller's context. Only for
// translation units built with the CUDA toolkit.
#pragma once

#include <cuda_runtime_api.h>

#include "runtime/core/error.h"

#define STRATA_CUDA_CHECK(expr, ...)                                                                                \
  do {                                                                                                              \
    const cudaError_t strata_cuda_err_ = (expr);                                                                    \
    if (strata_cuda_err_ != cudaSuccess) {                                                                          \
      ::strata::detail::throw_error(                                                                                \
          ::strata::Errc::cuda,                                                                                     \
          ::strata::str_cat(__VA_ARGS__ __VA_OPT__(, ": "), #expr, " failed: ", cudaGetErrorName(strata_cuda_err_), \
                            " (", cudaGetErrorString(strata_cuda_err_), ")"),                                       \
          __FILE__, __LINE__);                                                                                      \
    }                                                                                                               \
  } while (0)
