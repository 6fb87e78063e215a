// Built without CUDA: the GPT's GPU side reports why it cannot run.
#include "models/gpt/detail/gpt_cuda.h"
#include "runtime/core/error.h"

namespace strata::model::detail {
namespace {
[[noreturn]] void no_cuda() { STRATA_THROW(Errc::unsupported, "the GPT on cuda: unsupported: built without CUDA"); }
}  // namespace

void cuda_gemm(void*, ops::Products, bool, bool, int, int, int, float, const float*, int, const float*, int, float,
               float*, int) {
  no_cuda();
}
void cuda_gemm_batched(void*, ops::Products, bool, bool, int, int, int, float, const float*, int, long long,
                       const float*, int, long long, float, float*, int, long long, int) {
  no_cuda();
}
void cuda_fill_rows(void*, float*, const float*, int, int) { no_cuda(); }
void cuda_column_sums(void*, float*, const float*, int, int) { no_cuda(); }
void cuda_layernorm_forward(void*, float*, float*, float*, const float*, const float*, const float*, int, int) {
  no_cuda();
}
void cuda_layernorm_backward_input(void*, float*, const float*, const float*, const float*, const float*, const float*,
                                   int, int) {
  no_cuda();
}
void cuda_layernorm_backward_weight(void*, float*, float*, const float*, const float*, const float*, const float*, int,
                                    int) {
  no_cuda();
}
void cuda_gelu_forward(void*, float*, const float*, std::size_t) { no_cuda(); }
void cuda_gelu_backward(void*, float*, const float*, const float*, std::size_t) { no_cuda(); }
void cuda_causal_softmax(void*, float*, int, int) { no_cuda(); }
void cuda_causal_softmax_backward(void*, float*, const float*, int, int) { no_cuda(); }
void cuda_embedding_forward(void*, float*, const std::int32_t*, const float*, const float*, int, int, int) {
  no_cuda();
}
void cuda_embedding_backward(void*, float*, float*, const float*, const std::int32_t*, const std::int32_t*,
                             const std::int32_t*, int, int, int, int) {
  no_cuda();
}
void cuda_cross_entropy(void*, float*, float*, const std::int32_t*, int, int, float) { no_cuda(); }
void cuda_axpby(void*, float*, float, const float*, float, std::size_t) { no_cuda(); }

}  // namespace strata::model::detail
