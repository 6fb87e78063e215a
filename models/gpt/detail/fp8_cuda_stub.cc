// Built without CUDA: the FP8 products' GPU side reports why it cannot run.
#include "models/gpt/detail/fp8_cuda.h"
#include "runtime/core/error.h"

namespace strata::model::detail {

void* fp8_lt_create() { STRATA_THROW(Errc::unsupported, "fp8 on cuda: unsupported: built without CUDA"); }
void fp8_lt_destroy(void*) noexcept {}
void cuda_fp8_quantize(void*, const float*, void*, std::size_t, DType, const float*, float*) {
  STRATA_THROW(Errc::unsupported, "fp8 on cuda: unsupported: built without CUDA");
}
void cuda_fp8_quantize_transposed(void*, const float*, int, int, void*, DType, const float*, float*) {
  STRATA_THROW(Errc::unsupported, "fp8 on cuda: unsupported: built without CUDA");
}
void cuda_fp8_fake_quantize(void*, const float*, float*, std::size_t, DType, const float*, float*) {
  STRATA_THROW(Errc::unsupported, "fp8 on cuda: unsupported: built without CUDA");
}
void cuda_fp8_amax(void*, const float*, std::size_t, float*) {
  STRATA_THROW(Errc::unsupported, "fp8 on cuda: unsupported: built without CUDA");
}
void cuda_fp8_set_scale(void*, float*, float*, float) {
  STRATA_THROW(Errc::unsupported, "fp8 on cuda: unsupported: built without CUDA");
}
void cuda_fp8_gemm(void*, void*, int, int, int, const void*, DType, const float*, const void*, DType, const float*,
                   float, float, float*, void*, std::size_t) {
  STRATA_THROW(Errc::unsupported, "fp8 on cuda: unsupported: built without CUDA");
}

}  // namespace strata::model::detail
