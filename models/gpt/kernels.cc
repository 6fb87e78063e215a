// The host device's GptKernels (see kernels.h): ops.h, called in place.
#include "models/gpt/kernels.h"

#include <algorithm>

#include "models/gpt/cuda_kernels.h"
#include "runtime/device/device.h"

namespace strata::model {
namespace {

class HostKernels final : public GptKernels {
 public:
  void matmul_forward(float* out, const float* inp, const float* W, const float* b, int N, int IC, int OC,
                      ops::Products p, const ops::ProductScales& s) override {
    ops::matmul_forward(out, inp, W, b, N, IC, OC, p, s);
  }
  void matmul_backward_input(float* dinp, const float* dout, const float* W, int N, int IC, int OC, bool accumulate,
                             ops::Products p, const ops::ProductScales& s) override {
    ops::matmul_backward_input(dinp, dout, W, N, IC, OC, accumulate, p, s);
  }
  void matmul_backward_weight(float* dW, float* db, const float* dout, const float* inp, int N, int IC, int OC,
                              ops::Products p, const ops::ProductScales& s) override {
    ops::matmul_backward_weight(dW, db, dout, inp, N, IC, OC, p, s);
  }
  void matmul_backward(float* dinp, float* dW, float* db, const float* dout, const float* inp, const float* W, int N,
                       int IC, int OC, ops::Products p, const ops::ProductScales& s) override {
    ops::matmul_backward(dinp, dW, db, dout, inp, W, N, IC, OC, false, p, s);
  }
  std::unique_ptr<ops::Bf16Shadow> round_once(ops::Products p, const float* x, std::size_t n) override {
    return std::make_unique<ops::Bf16Shadow>(p, x, n);
  }
  void bias_backward(float* db, const float* dout, int N, int OC) override { ops::bias_backward(db, dout, N, OC); }
  void lm_head_forward(float* logits, const float* inp, const float* wte, int N, int C, int V, ops::Products p,
                       const ops::ProductScales& s) override {
    ops::lm_head_forward(logits, inp, wte, N, C, V, p, s);
  }
  void lm_head_backward(float* dinp, float* dwte, const float* dlogits, const float* inp, const float* wte, int N,
                        int C, int V, ops::Products p, const ops::ProductScales& s) override {
    ops::lm_head_backward(dinp, dwte, dlogits, inp, wte, N, C, V, p, s);
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b, int N,
                         int C) override {
    ops::layernorm_forward(out, mean, rstd, inp, w, b, N, C);
  }
  void layernorm_backward_input(float* dinp, const float* dout, const float* inp, const float* w, const float* mean,
                                const float* rstd, int N, int C) override {
    ops::layernorm_backward_input(dinp, dout, inp, w, mean, rstd, N, C);
  }
  void layernorm_backward_weight(float* dw, float* db, const float* dout, const float* inp, const float* mean,
                                 const float* rstd, int N, int C) override {
    ops::layernorm_backward_weight(dw, db, dout, inp, mean, rstd, N, C);
  }
  void gelu_forward(float* out, const float* inp, std::size_t n) override { ops::gelu_forward(out, inp, n); }
  void gelu_backward(float* dinp, const float* inp, const float* dout, std::size_t n) override {
    ops::gelu_backward(dinp, inp, dout, n);
  }
  void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH, float score_scale,
                         ops::Products) override {
    ops::attention_forward(out, att, qkv, B, T, C, NH, score_scale);
  }
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int C,
                          int NH, float score_scale, ops::Products) override {
    ops::attention_backward(dqkv, dout, qkv, att, B, T, C, NH, score_scale);
  }
  void embedding_forward(float* out, const std::int32_t* tokens, const float* wte, const float* wpe, int B, int T,
                         int C) override {
    ops::embedding_forward(out, tokens, wte, wpe, B, T, C);
  }
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens, int B, int T,
                          int C) override {
    ops::embedding_backward(dwte, dwpe, dout, tokens, B, T, C);
  }
  double cross_entropy(float* logits, float* losses, const std::int32_t* targets, int N, int V,
                       float grad_scale) override {
    return ops::cross_entropy(logits, losses, targets, N, V, grad_scale);
  }
  void accumulate(float* acc, const float* x, std::size_t n) override { ops::accumulate(acc, x, n); }
  void scale(float* x, float s, std::size_t n) override { ops::scale(x, s, n); }
  void weighted_add(float* acc, float acc_scale, const float* x, float x_scale, std::size_t n) override {
    ops::weighted_add(acc, acc_scale, x, x_scale, n);
  }
  void copy(float* dst, const float* src, std::size_t n) override { std::copy(src, src + n, dst); }
  void zero(float* dst, std::size_t n) override { std::fill(dst, dst + n, 0.0f); }
  void convert(const void* src, DType from, void* dst, DType to, std::size_t n) override {
    strata::convert(src, from, dst, to, n);
  }
  void to_host(float* host, const float* src, std::size_t n) override { std::copy(src, src + n, host); }
  void sync() override {}
};

}  // namespace

GptKernels& host_kernels() {
  static HostKernels k;
  return k;
}

std::unique_ptr<GptKernels> make_kernels(device::Device& dev, int max_tokens, std::size_t max_att,
                                         device::Stream* stream) {
  if (dev.backend() == device::Backend::cuda) return make_cuda_kernels(dev, max_tokens, max_att, stream);
  return std::make_unique<HostKernels>();
}

}  // namespace strata::model
