// Plain reference versions of the Llama family's host operations (ops.h): textbook loops, one
// thread, every sum in double. Same signatures and conventions; the tests hold ops.h to these
// with bounds derived from fp32 epsilon and each sum's length.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace strata::model::llama::ref {

void linear_forward(float* out, const float* inp, const float* W, const float* b, int N, int IC, int OC);
void linear_backward_input(float* dinp, const float* dout, const float* W, int N, int IC, int OC, bool accumulate);
void linear_backward_weight(float* dW, float* db, const float* dout, const float* inp, int N, int IC, int OC);
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N, int C, float eps);
void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w, const float* rstd,
                      int N, int C, bool accumulate);
void rope_tables(float* cos, float* sin, const std::vector<double>& inv_freq, int T);
void rope_forward(float* x, const float* cos, const float* sin, int B, int T, int heads, int hd);
void rope_backward(float* dx, const float* cos, const float* sin, int B, int T, int heads, int hd);
void swiglu_forward(float* out, const float* gate, const float* up, std::size_t n);
void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, std::size_t n);
void attention_forward(float* out, float* att, const float* q, const float* k, const float* v, int B, int T, int heads,
                       int kv_heads, int hd);
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                        const float* v, const float* att, int B, int T, int heads, int kv_heads, int hd);
void embedding_forward(float* out, const std::int32_t* tokens, const float* table, int N, int C);
void embedding_backward(float* dtable, const float* dout, const std::int32_t* tokens, int N, int C);

}  // namespace strata::model::llama::ref
