// The GPT's FP8 products on a CUDA device: Fp8Products' recipe (fp8_products.h) with FP8
// codes multiplied by cuBLASLt on the tensor cores (detail/fp8_cuda.h), enqueued on the pass's
// kernel stream.
//
// Each product quantizes its operands to codes at the step's scales and runs K-major ("TN"):
// forward out = q(x) q(W^T)^T; input gradient q(g) q(W)^T; weight gradient q(x^T) q(g^T)^T, the
// transposed operands quantized straight into transposed codes. The head's products alike.
// A product whose dimensions are not all multiples of 16 (cuBLASLt's FP8 rule: a sampling
// pass's few rows, an odd sequence length) takes the host simulation's route on the GPU
// instead: operands quantized and decoded back to fp32 (the same values), then an fp32 cuBLAS
// product. Either route sums in fp32, in another order than the host device's.
//
// Scales: each operand's scale and its inverse live in device memory, uploaded when the
// history gives a new one (at most once per operand per step). While an operand's history
// is empty (the first step) its scale comes from its own amax, which is read back first:
// one wait per operand, in the first step only. Amax is recorded by the quantize kernels
// into device memory and read back once, when the owner asks for step_amax().
// Block scaling is refused: Hopper's cuBLASLt takes one scale per operand.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "models/gpt/fp8_products.h"
#include "runtime/device/device.h"

namespace strata::model {

class CudaFp8Products final : public Fp8Products {
 public:
  // scratch as Fp8Products', sized by scratch_floats(shape, max_tokens); `kernels` are the
  // pass's CUDA kernels; their device holds this object's state (device_bytes()).
  CudaFp8Products(const fp8::Recipe& recipe, const GptShape& shape, int max_tokens, Scratch scratch,
                  GptKernels& kernels, device::Device& dev);
  ~CudaFp8Products() override;
  // Device bytes beside the scratch: scales, amax and cuBLASLt's workspace.
  static std::uint64_t device_bytes(const GptShape& shape) noexcept;

  void forward(int site, float* out, const float* inp, const float* W, const float* b, int N, int IC, int OC,
               const ops::ProductScales& s) override;
  void backward(int site, float* dinp, float* dW, float* db, const float* dout, const float* inp, const float* W, int N,
                int IC, int OC, bool accumulate, const ops::ProductScales& s) override;
  void head_forward(float* logits, const float* inp, const float* wte, int N, int C, int V,
                    const ops::ProductScales& s) override;
  void head_backward(float* dinp, float* dwte, const float* dlogits, const float* inp, const float* wte, int N, int C,
                     int V, const ops::ProductScales& s) override;

 protected:
  const float* quantize(const Operand& o, const float* src, int rows, int cols, float* dst) override;
  void collect_amax() override;

 private:
  // Codes of the rows x cols matrix src (transposed: of its transpose) in dst; returns dst.
  const void* codes(const Operand& o, const float* src, int rows, int cols, bool transposed, void* dst);
  // The operand's scale this step, uploaded where it changed; returns the device slot.
  const float* scale_slot(const Operand& o, const float* src, std::size_t n);
  const float* inverse(const Operand& o) const noexcept;
  float* amax_slot(const Operand& o);
  // Whether cuBLASLt's FP8 kernels take a product over these dimensions writing to `outs`
  // (null entries ignored): every dimension a multiple of 16, every pointer 16-byte aligned.
  bool tensor_cores(std::initializer_list<int> dims, std::initializer_list<const void*> outs) const noexcept;
  // The codes of `bytes` fit where they are written (the scratch is sized for the widest).
  static void fits(std::size_t bytes, std::size_t room, const char* what);
  // C[M,N] = alpha (A's values) (B's values)^T + beta C for the codes A of operand a and B of b.
  void gemm(int M, int N, int K, const void* A, const Operand& a, const void* B, const Operand& b, float alpha,
            float beta, float* C);
  void* st() noexcept { return kernels().native_stream(); }

  int operands_;
  // Byte halves of the x and g scratch (codes and transposed codes) and the w scratch.
  std::uint8_t *x_[2] = {}, *g_[2] = {}, *w_ = nullptr;
  std::size_t x_half_ = 0, g_half_ = 0, w_bytes_ = 0;
  bool aligned_ = false;        // the scratch suits cuBLASLt
  device::DeviceBuffer state_;  // a scale and inverse slot per operand | amax[ops] | two spare amax | workspace
  float *scale_ = nullptr, *amax_ = nullptr, *spare_ = nullptr;
  void* workspace_ = nullptr;
  void* lt_ = nullptr;
  std::vector<float> uploaded_;  // each operand's scale as last uploaded (0: none yet)
  std::vector<bool> used_;       // amax recorded this step
};

}  // namespace strata::model
