// Built without CUDA: the CUDA optimizer kernels report why they cannot run.
#include "optim/detail/cuda_launch.h"
#include "runtime/core/error.h"

namespace strata::optim::detail {

void cuda_adam_step_async(void*, const AdamScalars&, const StepArgs&) {
  STRATA_THROW(Errc::unsupported, "cuda adam step: unsupported: built without CUDA");
}

void cuda_grad_norm_partials_async(void*, const void*, DType, std::size_t, double*) {
  STRATA_THROW(Errc::unsupported, "cuda grad norm: unsupported: built without CUDA");
}

}  // namespace strata::optim::detail
