// Built without CUDA: the demo MLP's GPU arithmetic reports why it cannot run.
#include "models/detail/mlp_cuda.h"
#include "runtime/core/error.h"

namespace strata::model::detail {

void* cuda_blas_create(void*) { STRATA_THROW(Errc::unsupported, "mlp on cuda: unsupported: built without CUDA"); }
void cuda_blas_destroy(void*) noexcept {}
void cuda_mlp_forward(void*, void*, const float*, const float*, const float*, float*, std::size_t, std::size_t, bool) {
  STRATA_THROW(Errc::unsupported, "mlp on cuda: unsupported: built without CUDA");
}
void cuda_mlp_backward(void*, void*, const float*, const float*, const float*, float*, float*, float*, float*,
                       std::size_t, std::size_t, bool) {
  STRATA_THROW(Errc::unsupported, "mlp on cuda: unsupported: built without CUDA");
}

}  // namespace strata::model::detail
