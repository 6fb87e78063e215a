// Built without CUDA: the Llama family's GPU side reports why it cannot run.
#include "models/llama/detail/llama_cuda.h"
#include "runtime/core/error.h"

namespace strata::model::detail {
namespace {
[[noreturn]] void no_cuda() {
  STRATA_THROW(Errc::unsupported, "the Llama family on cuda: unsupported: built without CUDA");
}
}  // namespace

void cuda_rmsnorm_forward(void*, float*, float*, const float*, const float*, int, int, float) { no_cuda(); }
void cuda_rmsnorm_backward_input(void*, float*, const float*, const float*, const float*, const float*, int, int,
                                 bool) {
  no_cuda();
}
void cuda_rmsnorm_backward_weight(void*, float*, const float*, const float*, const float*, int, int) { no_cuda(); }
void cuda_rope(void*, float*, const float*, const float*, int, int, int, int, float) { no_cuda(); }
void cuda_swiglu_forward(void*, float*, const float*, const float*, std::size_t) { no_cuda(); }
void cuda_swiglu_backward(void*, float*, float*, const float*, const float*, const float*, std::size_t) { no_cuda(); }
void cuda_embedding_forward(void*, float*, const std::int32_t*, const float*, int, int) { no_cuda(); }
void cuda_embedding_backward(void*, float*, const float*, const std::int32_t*, const std::int32_t*, const std::int32_t*,
                             int, int) {
  no_cuda();
}

}  // namespace strata::model::detail
