// Where the Llama family's operations run. LlamaKernels is ops.h as an object, one per
// backend, so the block (block.h) and the pass (pass.h) are written once for both: the host
// ones call ops.h on the calling thread (the same bits as calling it directly); the CUDA ones
// (cuda_kernels.h) enqueue the same arithmetic on a CUDA stream: cuBLAS products in the same
// precision (fp32 with no TF32; bf16 operands with fp32 sums) and kernels that follow the
// host loops (detail/llama_cuda.h). What the Llama shares with the GPT (the LM head, the
// loss, elementwise adds, copies, conversions, waiting) is the GPT's kernels on the same
// device and stream: gpt(), which is also what an EngineAccess converts through.
//
// Protocol: as GptKernels (models/gpt/kernels.h): every float pointer is memory of the
// kernels' device; token arrays are host arrays (the CUDA kernels upload them); calls, gpt()'s
// included, are ordered as made; work may be in flight when a call returns, and gpt().sync()
// waits for it. upload() returns once its host array may be reused.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "models/gpt/kernels.h"
#include "models/llama/ops.h"

namespace strata::device {
class Device;
class Stream;
}  // namespace strata::device

namespace strata::model {

class LlamaKernels {
 public:
  virtual ~LlamaKernels() = default;
  // The GPT's kernels on the same device and stream.
  virtual GptKernels& gpt() noexcept = 0;

  // ops.h's operations, with its shapes and meanings.
  virtual void linear_forward(float* out, const float* inp, const float* W, const float* b, int N, int IC, int OC,
                              ops::Products p) = 0;
  virtual void linear_backward_input(float* dinp, const float* dout, const float* W, int N, int IC, int OC,
                                     bool accumulate, ops::Products p) = 0;
  virtual void linear_backward_weight(float* dW, float* db, const float* dout, const float* inp, int N, int IC, int OC,
                                      ops::Products p) = 0;
  virtual void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N, int C, float eps) = 0;
  virtual void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                                const float* rstd, int N, int C, bool accumulate) = 0;
  // rmsnorm_backward's halves apart (the Zero Bubble split: block.h), each with the bits it
  // gives in the fused call.
  virtual void rmsnorm_backward_input(float* dinp, const float* dout, const float* inp, const float* w,
                                      const float* rstd, int N, int C, bool accumulate) = 0;
  virtual void rmsnorm_backward_weight(float* dw, const float* dout, const float* inp, const float* rstd, int N,
                                       int C) = 0;
  virtual void rope_forward(float* x, const float* cos, const float* sin, int B, int T, int heads, int hd) = 0;
  virtual void rope_backward(float* dx, const float* cos, const float* sin, int B, int T, int heads, int hd) = 0;
  virtual void swiglu_forward(float* out, const float* gate, const float* up, std::size_t n) = 0;
  virtual void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                               std::size_t n) = 0;
  // att: what forward keeps for backward: the host's row statistics and output
  // (llama::attention_state_floats, linear in T), CUDA's [B,heads,T,T] probabilities
  // (keeps_full_scores(); LlamaDims::full_scores sizes it).
  virtual bool keeps_full_scores() const noexcept { return false; }
  virtual void attention_forward(float* out, float* att, const float* q, const float* k, const float* v, int B, int T,
                                 int heads, int kv_heads, int hd) = 0;
  virtual void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                                  const float* v, const float* att, int B, int T, int heads, int kv_heads, int hd) = 0;
  virtual void embedding_forward(float* out, const std::int32_t* tokens, const float* table, int N, int C) = 0;
  virtual void embedding_backward(float* dtable, const float* dout, const std::int32_t* tokens, int N, int C) = 0;
  // dst[0, n) = host[0, n) (the rotary tables).
  virtual void upload(float* dst, const float* host, std::size_t n) = 0;
};

// The host device's kernels (one instance serves every caller: they keep no state).
LlamaKernels& host_llama_kernels();

// Kernels for `dev`: the host ones, or CUDA kernels with scratch for micro-batches of up to
// max_tokens tokens and max_att floats of attention scores (allocated on `dev`, inside its
// budget: llama_cuda_scratch_bytes), on `stream` (one of dev's, which must outlive them) or,
// null, on a stream of their own.
std::unique_ptr<LlamaKernels> make_llama_kernels(device::Device& dev, int max_tokens, std::size_t max_att,
                                                 device::Stream* stream = nullptr);
std::uint64_t llama_cuda_scratch_bytes(int max_tokens, std::size_t max_att) noexcept;

}  // namespace strata::model
