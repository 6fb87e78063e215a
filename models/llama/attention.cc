// Causal grouped-query attention on the host (see ops.h), made of the tiled attention of
// gpt/flash_attention.h: forward runs each (batch, query head) pair as one task; backward runs
// each (batch, kv head) pair as one task that goes through its query heads in order, so the kv
// gradients they share are summed in a fixed order.
#include <tbb/parallel_for.h>

#include <cmath>
#include <cstddef>

#include "models/gpt/flash_attention.h"
#include "models/llama/ops.h"

namespace strata::model::llama {
namespace {

struct Layout {
  int T, NH, NKV, hd;
  int lq() const { return NH * hd; }
  int lk() const { return NKV * hd; }
  std::size_t q_at(int b, int h) const {
    return static_cast<std::size_t>(b) * T * lq() + static_cast<std::size_t>(h) * hd;
  }
  std::size_t kv_at(int b, int g) const {
    return static_cast<std::size_t>(b) * T * lk() + static_cast<std::size_t>(g) * hd;
  }
  ops::AttentionHead head(const float* q, const float* k, const float* v, int b, int h) const {
    const std::size_t ko = kv_at(b, h / (NH / NKV));
    return {q + q_at(b, h), k + ko, v + ko, T, hd, lq(), lk(), 1.0f / std::sqrt(static_cast<float>(hd))};
  }
};

}  // namespace

std::size_t attention_state_floats(int B, int T, int heads, int hd) {
  return static_cast<std::size_t>(B) * static_cast<std::size_t>(T) * static_cast<std::size_t>(heads) *
         (1 + static_cast<std::size_t>(hd));
}

void attention_forward(float* out, float* state, const float* q, const float* k, const float* v, int B, int T, int NH,
                       int NKV, int hd) {
  const Layout x{T, NH, NKV, hd};
  float* y_copy = state + static_cast<std::size_t>(B) * NH * T;
  tbb::parallel_for(0, B * NH, [&](int bh) {
    const int b = bh / NH, h = bh % NH;
    ops::flash_forward(x.head(q, k, v, b, h), out + x.q_at(b, h), x.lq(), state + static_cast<std::size_t>(bh) * T,
                       y_copy + x.q_at(b, h));
  });
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                        const float* v, const float* state, int B, int T, int NH, int NKV, int hd) {
  const Layout x{T, NH, NKV, hd};
  const int group = NH / NKV;
  const float* y = state + static_cast<std::size_t>(B) * NH * T;
  tbb::parallel_for(0, B * NKV, [&](int bg) {
    const int b = bg / NKV, g = bg % NKV;
    for (int j = 0; j < group; ++j) {
      const int h = g * group + j;
      const std::size_t qo = x.q_at(b, h), ko = x.kv_at(b, g);
      ops::flash_backward(x.head(q, k, v, b, h), dout + qo, y + qo, x.lq(),
                          state + (static_cast<std::size_t>(b) * NH + h) * T, dq + qo, dk + ko, dv + ko, j > 0);
    }
  });
}

}  // namespace strata::model::llama
