// CudaLlamaKernels (see cuda_kernels.h). Linear layers are the GPT's cuBLAS products with W
// read as [out, in]; attention follows the host's full T x T scores with strided-batched
// products: for each sequence b and each position j inside a kv group, one batch runs over the
// kv groups g (query head h = g G + j, kv head g), so the kv gradients, which a group's query
// heads share, are summed over j in the host's order (beta 0, then 1), never two at once.
// Host-side inputs (token ids, the embedding gradient's grouping) are uploaded from members
// that live until the next call, so an asynchronous copy never reads freed memory.
#include "models/llama/cuda_kernels.h"

#include <cmath>
#include <vector>

#include "models/detail/mlp_cuda.h"
#include "models/gpt/cuda_kernels.h"
#include "models/gpt/detail/gpt_cuda.h"
#include "models/llama/detail/llama_cuda.h"
#include "runtime/core/error.h"
#include "runtime/device/device.h"

namespace strata::model {
namespace {

// Int slots of the scratch: tokens and the embedding gradient's grouping (order, starts,
// tokens: 3 N + 1), rounded up so the scores' gradient that follows is 256-byte aligned.
std::size_t int_slots(int max_tokens) {
  const std::size_t n = 4 * static_cast<std::size_t>(max_tokens) + 1;
  return (n + 63) / 64 * 64;
}

class CudaLlamaKernels final : public LlamaKernels {
 public:
  CudaLlamaKernels(device::Device& dev, int max_tokens, std::size_t max_att, device::Stream* stream)
      : owned_(stream == nullptr ? dev.create_stream() : nullptr),
        stream_(stream != nullptr ? stream : owned_.get()),
        gpt_(make_cuda_kernels(dev, max_tokens, 0, stream_)),
        max_tokens_(max_tokens),
        max_att_(max_att) {
    scratch_ = device::DeviceBuffer(dev, (int_slots(max_tokens) + max_att) * 4, "llama cuda scratch");
    auto* ints = scratch_.as<std::int32_t>();
    tokens_ = ints;
    groups_ = ints + max_tokens;
    dscores_ = reinterpret_cast<float*>(ints + int_slots(max_tokens));
    blas_ = detail::cuda_blas_create(stream_->native_handle());
  }
  ~CudaLlamaKernels() override {
    try {
      stream_->synchronize();
    } catch (...) {  // the error was reported by the call that waited last; nothing to add here
    }
    detail::cuda_blas_destroy(blas_);
  }
  CudaLlamaKernels(const CudaLlamaKernels&) = delete;
  CudaLlamaKernels& operator=(const CudaLlamaKernels&) = delete;

  GptKernels& gpt() noexcept override { return *gpt_; }

  // out[N,OC] = inp[N,IC] W[OC,IC]^T (+ b)
  void linear_forward(float* out, const float* inp, const float* W, const float* b, int N, int IC, int OC,
                      ops::Products p) override {
    float beta = 0.0f;
    if (b != nullptr) {
      detail::cuda_fill_rows(st(), out, b, N, OC);
      beta = 1.0f;
    }
    detail::cuda_gemm(blas_, p, false, true, N, OC, IC, 1.0f, inp, IC, W, IC, beta, out, OC);
  }
  // dinp[N,IC] (+)= dout[N,OC] W[OC,IC]
  void linear_backward_input(float* dinp, const float* dout, const float* W, int N, int IC, int OC, bool accumulate,
                             ops::Products p) override {
    detail::cuda_gemm(blas_, p, false, false, N, IC, OC, 1.0f, dout, OC, W, IC, accumulate ? 1.0f : 0.0f, dinp, IC);
  }
  // dW[OC,IC] += dout^T inp
  void linear_backward_weight(float* dW, float* db, const float* dout, const float* inp, int N, int IC, int OC,
                              ops::Products p) override {
    detail::cuda_gemm(blas_, p, true, false, OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f, dW, IC);
    if (db != nullptr) detail::cuda_column_sums(st(), db, dout, N, OC);
  }
  void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N, int C, float eps) override {
    detail::cuda_rmsnorm_forward(st(), out, rstd, inp, w, N, C, eps);
  }
  void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w, const float* rstd,
                        int N, int C, bool accumulate) override {
    detail::cuda_rmsnorm_backward_input(st(), dinp, dout, inp, w, rstd, N, C, accumulate);
    detail::cuda_rmsnorm_backward_weight(st(), dw, dout, inp, rstd, N, C);
  }
  void rmsnorm_backward_input(float* dinp, const float* dout, const float* inp, const float* w, const float* rstd,
                              int N, int C, bool accumulate) override {
    detail::cuda_rmsnorm_backward_input(st(), dinp, dout, inp, w, rstd, N, C, accumulate);
  }
  void rmsnorm_backward_weight(float* dw, const float* dout, const float* inp, const float* rstd, int N,
                               int C) override {
    detail::cuda_rmsnorm_backward_weight(st(), dw, dout, inp, rstd, N, C);
  }
  void rope_forward(float* x, const float* cos, const float* sin, int B, int T, int heads, int hd) override {
    detail::cuda_rope(st(), x, cos, sin, B, T, heads, hd, 1.0f);
  }
  void rope_backward(float* dx, const float* cos, const float* sin, int B, int T, int heads, int hd) override {
    detail::cuda_rope(st(), dx, cos, sin, B, T, heads, hd, -1.0f);
  }
  void swiglu_forward(float* out, const float* gate, const float* up, std::size_t n) override {
    detail::cuda_swiglu_forward(st(), out, gate, up, n);
  }
  void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                       std::size_t n) override {
    detail::cuda_swiglu_backward(st(), dgate, dup, dout, gate, up, n);
  }

  bool keeps_full_scores() const noexcept override { return true; }
  void attention_forward(float* out, float* att, const float* q, const float* k, const float* v, int B, int T, int NH,
                         int NKV, int hd) override {
    const Heads h(T, NH, NKV, hd);
    for (int b = 0; b < B; ++b) {
      for (int j = 0; j < h.G; ++j) {
        // S = scale Q_h K_g^T
        detail::cuda_gemm_batched(blas_, ops::Products::fp32, false, true, T, T, hd, h.scale, q + h.qo(b, j), h.lq,
                                  h.sq, k + h.ko(b), h.lk, hd, 0.0f, att + h.ao(b, j), T, h.sa, NKV);
      }
    }
    detail::cuda_causal_softmax(st(), att, B * NH * T, T);
    for (int b = 0; b < B; ++b) {
      for (int j = 0; j < h.G; ++j) {
        // Y_h = P_h V_g
        detail::cuda_gemm_batched(blas_, ops::Products::fp32, false, false, T, hd, T, 1.0f, att + h.ao(b, j), T, h.sa,
                                  v + h.ko(b), h.lk, hd, 0.0f, out + h.qo(b, j), h.lq, h.sq, NKV);
      }
    }
  }
  void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                          const float* v, const float* att, int B, int T, int NH, int NKV, int hd) override {
    const Heads h(T, NH, NKV, hd);
    STRATA_CHECK(static_cast<std::size_t>(B) * NH * h.TT <= max_att_, Errc::invalid_argument,
                 "llama cuda attention: ", B, " x ", NH, " heads x ", T, "^2 scores exceed the scratch sized for ",
                 max_att_);
    for (int b = 0; b < B; ++b) {
      for (int j = 0; j < h.G; ++j) {
        const float beta = j == 0 ? 0.0f : 1.0f;
        // dP_h = dY_h V_g^T; dV_g (+)= P_h^T dY_h
        detail::cuda_gemm_batched(blas_, ops::Products::fp32, false, true, T, T, hd, 1.0f, dout + h.qo(b, j), h.lq,
                                  h.sq, v + h.ko(b), h.lk, hd, 0.0f, dscores_ + h.ao(b, j), T, h.sa, NKV);
        detail::cuda_gemm_batched(blas_, ops::Products::fp32, true, false, T, hd, T, 1.0f, att + h.ao(b, j), T, h.sa,
                                  dout + h.qo(b, j), h.lq, h.sq, beta, dv + h.ko(b), h.lk, hd, NKV);
      }
    }
    detail::cuda_causal_softmax_backward(st(), dscores_, att, B * NH * T, T);
    for (int b = 0; b < B; ++b) {
      for (int j = 0; j < h.G; ++j) {
        const float beta = j == 0 ? 0.0f : 1.0f;
        // dQ_h = scale dS_h K_g; dK_g (+)= scale dS_h^T Q_h
        detail::cuda_gemm_batched(blas_, ops::Products::fp32, false, false, T, hd, T, h.scale, dscores_ + h.ao(b, j), T,
                                  h.sa, k + h.ko(b), h.lk, hd, 0.0f, dq + h.qo(b, j), h.lq, h.sq, NKV);
        detail::cuda_gemm_batched(blas_, ops::Products::fp32, true, false, T, hd, T, h.scale, dscores_ + h.ao(b, j), T,
                                  h.sa, q + h.qo(b, j), h.lq, h.sq, beta, dk + h.ko(b), h.lk, hd, NKV);
      }
    }
  }

  void embedding_forward(float* out, const std::int32_t* tokens, const float* table, int N, int C) override {
    check_tokens(N);
    host_tokens_.assign(tokens, tokens + N);
    stream_->copy_async(tokens_, host_tokens_.data(), host_tokens_.size() * 4, device::CopyKind::host_to_device);
    detail::cuda_embedding_forward(st(), out, tokens_, table, N, C);
  }
  void embedding_backward(float* dtable, const float* dout, const std::int32_t* tokens, int N, int C) override {
    check_tokens(N);
    TokenGroups g = group_rows_by_token(tokens, N);
    const int segments = g.segments;
    host_groups_ = std::move(g.packed);
    stream_->copy_async(groups_, host_groups_.data(), host_groups_.size() * 4, device::CopyKind::host_to_device);
    const std::int32_t* d_start = groups_ + N;
    detail::cuda_embedding_backward(st(), dtable, dout, groups_, d_start, d_start + segments + 1, segments, C);
  }
  // The host array is a temporary of the caller's: copied, then waited for.
  void upload(float* dst, const float* host, std::size_t n) override {
    stream_->copy_async(dst, host, n * sizeof(float), device::CopyKind::host_to_device);
    stream_->synchronize();
  }

 private:
  // Offsets of one (sequence b, position j in a kv group) batch: query head h = g G + j.
  struct Heads {
    Heads(int T_, int NH, int NKV, int hd)
        : T(T_),
          G(NH / NKV),
          NH_(NH),
          hd_(hd),
          lq(NH * hd),
          lk(NKV * hd),
          TT(static_cast<long long>(T_) * T_),
          sq(static_cast<long long>(NH / NKV) * hd),
          sa(static_cast<long long>(NH / NKV) * T_ * T_),
          scale(1.0f / std::sqrt(static_cast<float>(hd))) {}
    int T, G, NH_, hd_, lq, lk;
    long long TT, sq, sa;  // sq, sa: from kv group g to g + 1 in q's columns and in the scores
    float scale;
    std::size_t qo(int b, int j) const {
      return static_cast<std::size_t>(b) * T * lq + static_cast<std::size_t>(j) * hd_;
    }
    std::size_t ko(int b) const { return static_cast<std::size_t>(b) * T * lk; }
    std::size_t ao(int b, int j) const {
      return (static_cast<std::size_t>(b) * NH_ + static_cast<std::size_t>(j)) * static_cast<std::size_t>(TT);
    }
  };

  void* st() const noexcept { return stream_->native_handle(); }
  void check_tokens(int N) const {
    STRATA_CHECK(N >= 0 && N <= max_tokens_, Errc::invalid_argument, "llama cuda: ", N,
                 " tokens exceed the scratch sized for ", max_tokens_);
  }

  std::unique_ptr<device::Stream> owned_;  // the kernels' own stream, unless given one
  device::Stream* stream_;
  std::unique_ptr<GptKernels> gpt_;  // on stream_; destroyed before owned_
  int max_tokens_;
  std::size_t max_att_;
  device::DeviceBuffer scratch_;
  std::int32_t *tokens_ = nullptr, *groups_ = nullptr;
  float* dscores_ = nullptr;
  void* blas_ = nullptr;
  std::vector<std::int32_t> host_tokens_, host_groups_;
};

}  // namespace

std::uint64_t llama_cuda_scratch_bytes(int max_tokens, std::size_t max_att) noexcept {
  return cuda_scratch_bytes(max_tokens, 0) + (int_slots(max_tokens) + max_att) * 4;
}

std::unique_ptr<LlamaKernels> make_cuda_llama_kernels(device::Device& dev, int max_tokens, std::size_t max_att,
                                                      device::Stream* stream) {
  return std::make_unique<CudaLlamaKernels>(dev, max_tokens, max_att, stream);
}

}  // namespace strata::model
