// Built without CUDA: the CUDA kernels of ops.h report why they cannot run.
#include "runtime/core/error.h"
#include "runtime/device/ops.h"

namespace strata::device::detail {

void cuda_convert_async(void*, const void*, DType, void*, DType, std::size_t, bool) {
  STRATA_THROW(Errc::unsupported, "cuda convert_async: unsupported: built without CUDA");
}

void cuda_accumulate_async(void*, float*, const void*, DType, std::size_t) {
  STRATA_THROW(Errc::unsupported, "cuda accumulate_async: unsupported: built without CUDA");
}

}  // namespace strata::device::detail
