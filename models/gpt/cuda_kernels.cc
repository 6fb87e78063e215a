// CudaKernels (see cuda_kernels.h). Host-side inputs (token ids, the embedding gradient's
// grouping of rows by token) are uploaded from members that live until the next call, so
// an asynchronous copy never reads freed memory; each input is one copy.
#include "models/gpt/cuda_kernels.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "models/detail/mlp_cuda.h"
#include "models/gpt/detail/gpt_cuda.h"
#include "runtime/core/error.h"
#include "runtime/device/device.h"
#include "runtime/device/ops.h"

namespace strata::model {
namespace {

// Int slots of the scratch: tokens, targets, and the embedding gradient's grouping (the
// row order, the segment starts + 1 and the segment tokens, packed); rounded up so the float part that follows is
// 256-byte aligned.
std::size_t int_slots(int max_tokens) {
  const std::size_t n = 5 * static_cast<std::size_t>(max_tokens) + 1;
  return (n + 63) / 64 * 64;
}

class CudaKernels final : public GptKernels {
 public:
  CudaKernels(device::Device& dev, int max_tokens, std::size_t max_att, device::Stream* stream)
      : owned_(stream == nullptr ? dev.create_stream() : nullptr),
        stream_(stream != nullptr ? stream : owned_.get()),
        max_tokens_(max_tokens),
        max_att_(max_att) {
    scratch_ = device::DeviceBuffer(dev, cuda_scratch_bytes(max_tokens, max_att), "gpt cuda scratch");
    auto* ints = scratch_.as<std::int32_t>();
    const auto M = static_cast<std::size_t>(max_tokens);
    tokens_ = ints;
    targets_ = ints + M;
    groups_ = ints + 2 * M;
    dscores_ = reinterpret_cast<float*>(ints + int_slots(max_tokens));
    blas_ = detail::cuda_blas_create(stream_->native_handle());
  }
  ~CudaKernels() override {
    try {
      stream_->synchronize();
    } catch (...) {  // the error was reported by the call that waited last; nothing to add here
    }
    detail::cuda_blas_destroy(blas_);
  }
  CudaKernels(const CudaKernels&) = delete;
  CudaKernels& operator=(const CudaKernels&) = delete;

  void matmul_forward(float* out, const float* inp, const float* W, const float* b, int N, int IC, int OC,
                      ops::Products p, const ops::ProductScales& s) override {
    float beta = 0.0f;
    if (b != nullptr) {
      detail::cuda_fill_rows(st(), out, b, N, OC);
      beta = 1.0f;
    }
    detail::cuda_gemm(blas_, p, false, false, N, OC, IC, s.fwd, inp, IC, W, OC, beta, out, OC);
  }
  void matmul_backward_input(float* dinp, const float* dout, const float* W, int N, int IC, int OC, bool accumulate,
                             ops::Products p, const ops::ProductScales& s) override {
    detail::cuda_gemm(blas_, p, false, true, N, IC, OC, s.grad_in, dout, OC, W, OC, accumulate ? 1.0f : 0.0f, dinp, IC);
  }
  void matmul_backward_weight(float* dW, float* db, const float* dout, const float* inp, int N, int IC, int OC,
                              ops::Products p, const ops::ProductScales& s) override {
    detail::cuda_gemm(blas_, p, true, false, IC, OC, N, s.grad_w, inp, IC, dout, OC, 1.0f, dW, OC);
    if (db != nullptr) detail::cuda_column_sums(st(), db, dout, N, OC);
  }
  void bias_backward(float* db, const float* dout, int N, int OC) override {
    detail::cuda_column_sums(st(), db, dout, N, OC);
  }
  void lm_head_forward(float* logits, const float* inp, const float* wte, int N, int C, int V, ops::Products p,
                       const ops::ProductScales& s) override {
    detail::cuda_gemm(blas_, p, false, true, N, V, C, s.fwd, inp, C, wte, C, 0.0f, logits, V);
  }
  void lm_head_backward(float* dinp, float* dwte, const float* dlogits, const float* inp, const float* wte, int N,
                        int C, int V, ops::Products p, const ops::ProductScales& s) override {
    detail::cuda_gemm(blas_, p, false, false, N, C, V, s.grad_in, dlogits, V, wte, C, 0.0f, dinp, C);
    detail::cuda_gemm(blas_, p, true, false, V, C, N, s.grad_w, dlogits, V, inp, C, 1.0f, dwte, C);
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b, int N,
                         int C) override {
    detail::cuda_layernorm_forward(st(), out, mean, rstd, inp, w, b, N, C);
  }
  void layernorm_backward_input(float* dinp, const float* dout, const float* inp, const float* w, const float* mean,
                                const float* rstd, int N, int C) override {
    detail::cuda_layernorm_backward_input(st(), dinp, dout, inp, w, mean, rstd, N, C);
  }
  void layernorm_backward_weight(float* dw, float* db, const float* dout, const float* inp, const float* mean,
                                 const float* rstd, int N, int C) override {
    detail::cuda_layernorm_backward_weight(st(), dw, db, dout, inp, mean, rstd, N, C);
  }
  void gelu_forward(float* out, const float* inp, std::size_t n) override {
    detail::cuda_gelu_forward(st(), out, inp, n);
  }
  void gelu_backward(float* dinp, const float* inp, const float* dout, std::size_t n) override {
    detail::cuda_gelu_backward(st(), dinp, inp, dout, n);
  }

  bool keeps_full_scores() const noexcept override { return true; }
  // Per sequence, the heads are one batched product each way (head h at columns h hs of q,
  // k and v, which sit side by side in qkv's rows).
  void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH, float score_scale,
                         ops::Products products) override {
    const int hs = C / NH;
    const long long TT = static_cast<long long>(T) * T;
    for (int b = 0; b < B; ++b) {
      const float* q = qkv + static_cast<std::size_t>(b) * T * 3 * C;
      float* p = att + static_cast<std::size_t>(b) * NH * TT;
      detail::cuda_gemm_batched(blas_, products, false, true, T, T, hs, score_scale, q, 3 * C, hs, q + C, 3 * C, hs,
                                0.0f, p, T, TT, NH);
    }
    detail::cuda_causal_softmax(st(), att, B * NH * T, T);
    for (int b = 0; b < B; ++b) {
      const float* v = qkv + static_cast<std::size_t>(b) * T * 3 * C + 2 * C;
      const float* p = att + static_cast<std::size_t>(b) * NH * TT;
      float* y = out + static_cast<std::size_t>(b) * T * C;
      detail::cuda_gemm_batched(blas_, products, false, false, T, hs, T, 1.0f, p, T, TT, v, 3 * C, hs, 0.0f, y, C, hs,
                                NH);
    }
  }
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int C,
                          int NH, float score_scale, ops::Products products) override {
    const int hs = C / NH;
    const long long TT = static_cast<long long>(T) * T;
    STRATA_CHECK(static_cast<std::size_t>(B) * NH * TT <= max_att_, Errc::invalid_argument, "gpt cuda attention: ", B,
                 " x ", NH, " heads x ", T, "^2 scores exceed the scratch sized for ", max_att_);
    for (int b = 0; b < B; ++b) {
      const std::size_t base = static_cast<std::size_t>(b) * T * 3 * C;
      const float* p = att + static_cast<std::size_t>(b) * NH * TT;
      const float* dy = dout + static_cast<std::size_t>(b) * T * C;
      float* ds = dscores_ + static_cast<std::size_t>(b) * NH * TT;
      // dP = dY V^T; dV = P^T dY
      detail::cuda_gemm_batched(blas_, products, false, true, T, T, hs, 1.0f, dy, C, hs, qkv + base + 2 * C, 3 * C, hs,
                                0.0f, ds, T, TT, NH);
      detail::cuda_gemm_batched(blas_, products, true, false, T, hs, T, 1.0f, p, T, TT, dy, C, hs, 0.0f,
                                dqkv + base + 2 * C, 3 * C, hs, NH);
    }
    detail::cuda_causal_softmax_backward(st(), dscores_, att, B * NH * T, T);
    for (int b = 0; b < B; ++b) {
      const std::size_t base = static_cast<std::size_t>(b) * T * 3 * C;
      const float* ds = dscores_ + static_cast<std::size_t>(b) * NH * TT;
      // dQ = scale dS K; dK = scale dS^T Q
      detail::cuda_gemm_batched(blas_, products, false, false, T, hs, T, score_scale, ds, T, TT, qkv + base + C, 3 * C,
                                hs, 0.0f, dqkv + base, 3 * C, hs, NH);
      detail::cuda_gemm_batched(blas_, products, true, false, T, hs, T, score_scale, ds, T, TT, qkv + base, 3 * C, hs,
                                0.0f, dqkv + base + C, 3 * C, hs, NH);
    }
  }

  void embedding_forward(float* out, const std::int32_t* tokens, const float* wte, const float* wpe, int B, int T,
                         int C) override {
    const int N = B * T;
    upload(tokens_, tokens, N, host_tokens_);
    detail::cuda_embedding_forward(st(), out, tokens_, wte, wpe, N, T, C);
  }
  // The host's grouping: rows stably sorted by token, one segment per token.
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens, int B, int T,
                          int C) override {
    const int N = B * T;
    check_tokens(N);
    const auto n = static_cast<std::size_t>(N);
    TokenGroups g = group_rows_by_token(tokens, N);
    const int segments = g.segments;
    host_groups_ = std::move(g.packed);
    stream_->copy_async(groups_, host_groups_.data(), host_groups_.size() * 4, device::CopyKind::host_to_device);
    const std::int32_t* d_start = groups_ + n;
    detail::cuda_embedding_backward(st(), dwte, dwpe, dout, groups_, d_start, d_start + segments + 1, segments, B, T,
                                    C);
  }
  double cross_entropy(float* logits, float* losses, const std::int32_t* targets, int N, int V,
                       float grad_scale) override {
    upload(targets_, targets, N, host_targets_);
    detail::cuda_cross_entropy(st(), logits, losses, targets_, N, V, grad_scale);
    host_losses_.resize(static_cast<std::size_t>(N));
    to_host(host_losses_.data(), losses, host_losses_.size());
    double total = 0.0;
    for (float l : host_losses_) total += l;
    return total;
  }

  void accumulate(float* acc, const float* x, std::size_t n) override { detail::cuda_axpby(st(), acc, 1, x, 1, n); }
  void scale(float* x, float s, std::size_t n) override { detail::cuda_axpby(st(), x, s, nullptr, 0, n); }
  void weighted_add(float* acc, float acc_scale, const float* x, float x_scale, std::size_t n) override {
    detail::cuda_axpby(st(), acc, acc_scale, x, x_scale, n);
  }
  void copy(float* dst, const float* src, std::size_t n) override {
    stream_->copy_async(dst, src, n * sizeof(float), device::CopyKind::device_to_device);
  }
  void zero(float* dst, std::size_t n) override { stream_->memset_async(dst, 0, n * sizeof(float)); }
  void convert(const void* src, DType from, void* dst, DType to, std::size_t n) override {
    device::convert_async(*stream_, src, from, dst, to, n);
  }
  void to_host(float* host, const float* src, std::size_t n) override {
    stream_->copy_async(host, src, n * sizeof(float), device::CopyKind::device_to_host);
    stream_->synchronize();
  }
  void sync() override { stream_->synchronize(); }
  void* native_stream() noexcept override { return st(); }

 private:
  void* st() const noexcept { return stream_->native_handle(); }
  void check_tokens(int N) const {
    STRATA_CHECK(N >= 0 && N <= max_tokens_, Errc::invalid_argument, "gpt cuda: ", N,
                 " tokens exceed the scratch sized for ", max_tokens_);
  }
  void upload(std::int32_t* dst, const std::int32_t* src, int N, std::vector<std::int32_t>& keep) {
    check_tokens(N);
    keep.assign(src, src + N);
    stream_->copy_async(dst, keep.data(), keep.size() * 4, device::CopyKind::host_to_device);
  }

  std::unique_ptr<device::Stream> owned_;  // the kernels' own stream, unless given one
  device::Stream* stream_;
  int max_tokens_;
  std::size_t max_att_;
  device::DeviceBuffer scratch_;
  std::int32_t *tokens_ = nullptr, *targets_ = nullptr, *groups_ = nullptr;
  float* dscores_ = nullptr;
  void* blas_ = nullptr;
  std::vector<std::int32_t> host_tokens_, host_targets_, host_groups_;
  std::vector<float> host_losses_;
};

}  // namespace

TokenGroups group_rows_by_token(const std::int32_t* tokens, int N) {
  const auto n = static_cast<std::size_t>(N);
  std::vector<std::int32_t> order(n), start, token;
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return tokens[a] < tokens[b]; });
  for (int i = 0; i < N; ++i) {
    const std::int32_t t = tokens[order[static_cast<std::size_t>(i)]];
    if (token.empty() || token.back() != t) {
      start.push_back(i);
      token.push_back(t);
    }
  }
  start.push_back(N);
  TokenGroups g;
  g.segments = static_cast<int>(token.size());
  g.packed = std::move(order);
  g.packed.insert(g.packed.end(), start.begin(), start.end());
  g.packed.insert(g.packed.end(), token.begin(), token.end());
  return g;
}

std::uint64_t cuda_scratch_bytes(int max_tokens, std::size_t max_att) noexcept {
  return (int_slots(max_tokens) + max_att) * 4;
}

std::unique_ptr<GptKernels> make_cuda_kernels(device::Device& dev, int max_tokens, std::size_t max_att,
                                              device::Stream* stream) {
  return std::make_unique<CudaKernels>(dev, max_tokens, max_att, stream);
}

}  // namespace strata::model
