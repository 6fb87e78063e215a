// The host device's LlamaKernels (see kernels.h): ops.h, called in place; the shared part is
// the GPT's host kernels.
#include "models/llama/kernels.h"

#include <algorithm>

#include "models/llama/cuda_kernels.h"
#include "runtime/device/device.h"

namespace strata::model {
namespace {

class HostLlamaKernels final : public LlamaKernels {
 public:
  GptKernels& gpt() noexcept override { return host_kernels(); }
  void linear_forward(float* out, const float* inp, const float* W, const float* b, int N, int IC, int OC,
                      ops::Products p) override {
    llama::linear_forward(out, inp, W, b, N, IC, OC, p);
  }
  void linear_backward_input(float* dinp, const float* dout, const float* W, int N, int IC, int OC, bool accumulate,
                             ops::Products p) override {
    llama::linear_backward_input(dinp, dout, W, N, IC, OC, accumulate, p);
  }
  void linear_backward_weight(float* dW, float* db, const float* dout, const float* inp, int N, int IC, int OC,
                              ops::Products p) override {
    llama::linear_backward_weight(dW, db, dout, inp, N, IC, OC, p);
  }
  void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N, int C, float eps) override {
    llama::rmsnorm_forward(out, rstd, inp, w, N, C, eps);
  }
  void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w, const float* rstd,
                        int N, int C, bool accumulate) override {
    llama::rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C, accumulate);
  }
  void rmsnorm_backward_input(float* dinp, const float* dout, const float* inp, const float* w, const float* rstd,
                              int N, int C, bool accumulate) override {
    llama::rmsnorm_backward_input(dinp, dout, inp, w, rstd, N, C, accumulate);
  }
  void rmsnorm_backward_weight(float* dw, const float* dout, const float* inp, const float* rstd, int N,
                               int C) override {
    llama::rmsnorm_backward_weight(dw, dout, inp, rstd, N, C);
  }
  void rope_forward(float* x, const float* cos, const float* sin, int B, int T, int heads, int hd) override {
    llama::rope_forward(x, cos, sin, B, T, heads, hd);
  }
  void rope_backward(float* dx, const float* cos, const float* sin, int B, int T, int heads, int hd) override {
    llama::rope_backward(dx, cos, sin, B, T, heads, hd);
  }
  void swiglu_forward(float* out, const float* gate, const float* up, std::size_t n) override {
    llama::swiglu_forward(out, gate, up, n);
  }
  void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                       std::size_t n) override {
    llama::swiglu_backward(dgate, dup, dout, gate, up, n);
  }
  void attention_forward(float* out, float* att, const float* q, const float* k, const float* v, int B, int T,
                         int heads, int kv_heads, int hd) override {
    llama::attention_forward(out, att, q, k, v, B, T, heads, kv_heads, hd);
  }
  void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                          const float* v, const float* att, int B, int T, int heads, int kv_heads, int hd) override {
    llama::attention_backward(dq, dk, dv, dout, q, k, v, att, B, T, heads, kv_heads, hd);
  }
  void embedding_forward(float* out, const std::int32_t* tokens, const float* table, int N, int C) override {
    llama::embedding_forward(out, tokens, table, N, C);
  }
  void embedding_backward(float* dtable, const float* dout, const std::int32_t* tokens, int N, int C) override {
    llama::embedding_backward(dtable, dout, tokens, N, C);
  }
  void upload(float* dst, const float* host, std::size_t n) override { std::copy(host, host + n, dst); }
};

}  // namespace

LlamaKernels& host_llama_kernels() {
  static HostLlamaKernels k;
  return k;
}

std::unique_ptr<LlamaKernels> make_llama_kernels(device::Device& dev, int max_tokens, std::size_t max_att,
                                                 device::Stream* stream) {
  if (dev.backend() == device::Backend::cuda) return make_cuda_llama_kernels(dev, max_tokens, max_att, stream);
  return std::make_unique<HostLlamaKernels>();
}

}  // namespace strata::model
