// Plain reference versions of the GPT's host operations (ops.h): the textbook loops, one
// thread, every sum in double. Same signatures and conventions as ops.h; the tests hold
// the fast versions to these with tolerances derived from fp32 epsilon and each sum's length.
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata::model::ops::ref {

void matmul_forward(float* out, const float* inp, const float* W, const float* b, int N, int IC, int OC);
void matmul_backward(float* dinp, float* dW, float* db, const float* dout, const float* inp, const float* W, int N,
                     int IC, int OC, bool accumulate);
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b, int N,
                       int C);
void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                        const float* mean, const float* rstd, int N, int C);
void gelu_forward(float* out, const float* inp, std::size_t n);
void gelu_backward(float* dinp, const float* inp, const float* dout, std::size_t n);
void embedding_forward(float* out, const std::int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C);
void embedding_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens, int B, int T, int C);
void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH, float score_scale);
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int C, int NH,
                        float score_scale);
double cross_entropy(float* logits, float* losses, const std::int32_t* targets, int N, int V, float grad_scale);

}  // namespace strata::model::ops::ref

namespace strata::model::ops::ref {
void lm_head_forward(float* logits, const float* inp, const float* wte, int N, int C, int V);
void lm_head_backward(float* dinp, float* dwte, const float* dlogits, const float* inp, const float* wte, int N, int C,
                      int V);
}  // namespace strata::model::ops::ref
