// The GPT's causal multi-head self-attention on the host (see ops.h): each (batch, head) pair
// is one task of the tiled attention of flash_attention.h, on q, k and v side by side in qkv.
#include <tbb/parallel_for.h>

#include <cmath>
#include <cstddef>

#include "models/gpt/flash_attention.h"
#include "models/gpt/ops.h"

namespace strata::model::ops {
namespace {

AttentionHead head(const float* qkv, int b, int h, int T, int C, int NH, float scale) {
  const int hs = C / NH;
  const float* q = qkv + static_cast<std::size_t>(b) * T * 3 * C + static_cast<std::size_t>(h) * hs;
  return {q, q + C, q + 2 * C, T, hs, 3 * C, 3 * C, scale};
}

// Offset of head h's columns of sequence b in a [B,T,C] array.
std::size_t at(int b, int h, int T, int C, int NH) {
  return static_cast<std::size_t>(b) * T * C + static_cast<std::size_t>(h) * (C / NH);
}

}  // namespace

float score_scale(int head_size) { return 1.0f / std::sqrt(static_cast<float>(head_size)); }

std::size_t attention_state_floats(int B, int T, int C, int NH) {
  return static_cast<std::size_t>(B) * static_cast<std::size_t>(T) *
         (static_cast<std::size_t>(NH) + static_cast<std::size_t>(C));
}

void attention_forward(float* out, float* state, const float* qkv, int B, int T, int C, int NH, float scale) {
  float* y_copy = state + static_cast<std::size_t>(B) * NH * T;
  tbb::parallel_for(0, B * NH, [&](int bh) {
    const int b = bh / NH, h = bh % NH;
    flash_forward(head(qkv, b, h, T, C, NH, scale), out + at(b, h, T, C, NH), C,
                  state + static_cast<std::size_t>(bh) * T, y_copy + at(b, h, T, C, NH));
  });
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* state, int B, int T, int C,
                        int NH, float scale) {
  const float* y = state + static_cast<std::size_t>(B) * NH * T;
  tbb::parallel_for(0, B * NH, [&](int bh) {
    const int b = bh / NH, h = bh % NH;
    float* dq = dqkv + static_cast<std::size_t>(b) * T * 3 * C + static_cast<std::size_t>(h) * (C / NH);
    flash_backward(head(qkv, b, h, T, C, NH, scale), dout + at(b, h, T, C, NH), y + at(b, h, T, C, NH), C,
                   state + static_cast<std::size_t>(bh) * T, dq, dq + C, dq + 2 * C, false);
  });
}

}  // namespace strata::model::ops
