// Where the GPT's operations run. GptKernels is ops.h as an object, one per backend, so the
// block (block.h) and the pass (pass.h) are written once for both: HostKernels calls ops.h
// (oneDNN products, TBB loops) on the calling thread; CudaKernels (cuda_kernels.cc) enqueues
// the same arithmetic on a CUDA stream of its own: cuBLAS products in the same precision
// (fp32 math with no TF32; bf16 or fp16 operands with fp32 sums) and kernels that follow the
// host loops (detail/gpt_cuda.h).
//
// Protocol: every float pointer is memory of the kernels' device; token and target arrays
// are host arrays (CudaKernels uploads them). Calls are ordered as made. Work may still be
// in flight when a call returns: sync() waits for it, and must come before the memory it
// touched is handed back (the engine's release and reduce_grads). cross_entropy and
// to_host return with their results, waiting as needed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "models/gpt/ops.h"
#include "runtime/core/dtype.h"

namespace strata::device {
class Device;
class Stream;
}  // namespace strata::device

namespace strata::model {

class GptKernels {
 public:
  virtual ~GptKernels() = default;

  // ops.h's products and their gradients (products: the weight products' precision).
  virtual void matmul_forward(float* out, const float* inp, const float* W, const float* b, int N, int IC, int OC,
                              ops::Products p, const ops::ProductScales& s) = 0;
  virtual void matmul_backward_input(float* dinp, const float* dout, const float* W, int N, int IC, int OC,
                                     bool accumulate, ops::Products p, const ops::ProductScales& s) = 0;
  virtual void matmul_backward_weight(float* dW, float* db, const float* dout, const float* inp, int N, int IC, int OC,
                                      ops::Products p, const ops::ProductScales& s) = 0;
  // Both halves (dinp null: the weight's alone); the host rounds dout to bf16 once for both.
  virtual void matmul_backward(float* dinp, float* dW, float* db, const float* dout, const float* inp, const float* W,
                               int N, int IC, int OC, ops::Products p, const ops::ProductScales& s) {
    if (dinp != nullptr) matmul_backward_input(dinp, dout, W, N, IC, OC, false, p, s);
    matmul_backward_weight(dW, db, dout, inp, N, IC, OC, p, s);
  }
  // While the returned shadow lives, products in p on this thread read x[0, n) rounded to bf16
  // once for all of them (gemm.h's Bf16Shadow): for an operand several products read. The
  // host's shadows nothing unless p's products run in bf16 there; other backends return null.
  virtual std::unique_ptr<ops::Bf16Shadow> round_once(ops::Products, const float*, std::size_t) { return nullptr; }
  // db[OC] += the column sums of dout[N,OC] (matmul_backward_weight's bias part alone).
  virtual void bias_backward(float* db, const float* dout, int N, int OC) = 0;
  virtual void lm_head_forward(float* logits, const float* inp, const float* wte, int N, int C, int V, ops::Products p,
                               const ops::ProductScales& s) = 0;
  virtual void lm_head_backward(float* dinp, float* dwte, const float* dlogits, const float* inp, const float* wte,
                                int N, int C, int V, ops::Products p, const ops::ProductScales& s) = 0;

  virtual void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                                 int N, int C) = 0;
  virtual void layernorm_backward_input(float* dinp, const float* dout, const float* inp, const float* w,
                                        const float* mean, const float* rstd, int N, int C) = 0;
  virtual void layernorm_backward_weight(float* dw, float* db, const float* dout, const float* inp, const float* mean,
                                         const float* rstd, int N, int C) = 0;
  void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                          const float* mean, const float* rstd, int N, int C) {
    layernorm_backward_input(dinp, dout, inp, w, mean, rstd, N, C);
    layernorm_backward_weight(dw, db, dout, inp, mean, rstd, N, C);
  }

  virtual void gelu_forward(float* out, const float* inp, std::size_t n) = 0;
  virtual void gelu_backward(float* dinp, const float* inp, const float* dout, std::size_t n) = 0;
  // products: the score and value products' precision on the CUDA backend (bf16 tensor-core
  // products with fp32 sums, as PyTorch's autocast runs attention); the host device's tiles
  // multiply in fp32 whatever it says (oneDNN's bf16 products on 64-row tiles, transposed
  // ones especially, were slower). att: what forward keeps for backward: the host's row
  // statistics and output (ops::attention_state_floats, linear in T), CUDA's [B,NH,T,T]
  // probabilities (keeps_full_scores(); BlockDims::full_scores sizes it).
  virtual bool keeps_full_scores() const noexcept { return false; }
  virtual void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH,
                                 float score_scale, ops::Products products) = 0;
  virtual void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T,
                                  int C, int NH, float score_scale, ops::Products products) = 0;
  virtual void embedding_forward(float* out, const std::int32_t* tokens, const float* wte, const float* wpe, int B,
                                 int T, int C) = 0;
  virtual void embedding_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens, int B, int T,
                                  int C) = 0;
  virtual double cross_entropy(float* logits, float* losses, const std::int32_t* targets, int N, int V,
                               float grad_scale) = 0;

  // Elementwise: acc += x; x *= s; acc = acc_scale acc + x_scale x; dst = src; dst = 0.
  virtual void accumulate(float* acc, const float* x, std::size_t n) = 0;
  virtual void scale(float* x, float s, std::size_t n) = 0;
  virtual void weighted_add(float* acc, float acc_scale, const float* x, float x_scale, std::size_t n) = 0;
  virtual void copy(float* dst, const float* src, std::size_t n) = 0;
  virtual void zero(float* dst, std::size_t n) = 0;
  // dtype conversion between device buffers (the engine's views and fp32).
  virtual void convert(const void* src, DType from, void* dst, DType to, std::size_t n) = 0;
  // host[0, n) = src[0, n), waiting for it.
  virtual void to_host(float* host, const float* src, std::size_t n) = 0;
  virtual void sync() = 0;
  // The CUDA stream every call is enqueued on (a cudaStream_t), for work of the same pass
  // written beside these kernels (the FP8 products); null on the host.
  virtual void* native_stream() noexcept { return nullptr; }
};

// The host device's kernels (one instance serves every caller: they keep no state).
GptKernels& host_kernels();

// Kernels for `dev`: the host ones, or CUDA kernels with scratch for micro-batches of up to
// max_tokens tokens, max_att floats of attention scores and vocab-sized rows (allocated on
// `dev`, inside its budget: cuda_scratch_bytes), on `stream` (one of dev's, which must
// outlive them) or, null, on a stream of their own.
std::unique_ptr<GptKernels> make_kernels(device::Device& dev, int max_tokens, std::size_t max_att,
                                         device::Stream* stream = nullptr);
std::uint64_t cuda_scratch_bytes(int max_tokens, std::size_t max_att) noexcept;

}  // namespace strata::model
