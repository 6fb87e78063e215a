// The GPT's matrix products with FP8 operands (fp8.h's recipe): kernels.h's matmul and LM-head
// products, each operand quantized into scratch before the fp32 product. This class is the
// host simulation, on the kernels it is given (the host's by default); on a CUDA device
// CudaFp8Products (fp8_cuda_products.h) runs the same products on FP8 tensor cores.
//
// Sites: every matrix product of the model is a site with its own delayed-scaling state for
// its three operands: x (the activation it multiplies), w (the weight) and g (the gradient
// of its output). Block l's products are sites 4l..4l+3 (qkv, attention projection, MLP up,
// MLP down); the LM head is site 4L. Forward quantizes x and w to E4M3; backward quantizes g
// to the gradient format and x and w again with the step's scales (the same values as in
// forward, so a re-materialized forward is also the same), then dx = q(g) q(w)^T and
// dW += q(x)^T q(g). Bias gradients are summed from the unquantized g. A unit-scaled model's
// products pass their three scales (ops::ProductScales), applied to the fp32 products.
//
// Protocol: a training pass records each operand's amax (set_recording(true)); evaluation
// passes quantize with the same scales and record nothing. After the optimizer step, the
// owner reduces step_amax() with max over the data-parallel ranks and calls end_step(amax),
// which moves every amax into its history; histories() and restore() carry the histories
// through a checkpoint. Scratch: three fp32 buffers of the kernels' device that the owner
// provides, sized by scratch_floats(), at construction or before each call (use_scratch).
#pragma once

#include <cstddef>
#include <vector>

#include "models/gpt/config.h"
#include "models/gpt/fp8.h"
#include "models/gpt/kernels.h"
#include "models/gpt/ops.h"

namespace strata::model {

class Fp8Products {
 public:
  struct Site {
    fp8::AmaxHistory x, w, g;
  };
  struct Scratch {
    float *x = nullptr, *w = nullptr, *g = nullptr;
  };
  // Floats of the three scratch buffers for micro-batches of up to max_tokens tokens.
  struct ScratchFloats {
    std::size_t x = 0, w = 0, g = 0;
    std::size_t total() const noexcept { return x + w + g; }
  };
  static ScratchFloats scratch_floats(const GptShape& s, std::size_t max_tokens) noexcept;
  static int site_count(const GptShape& s) noexcept { return 4 * s.layers + 1; }

  Fp8Products(const fp8::Recipe& recipe, const GptShape& shape, Scratch scratch, GptKernels& kernels = host_kernels());
  virtual ~Fp8Products() = default;
  Fp8Products(const Fp8Products&) = delete;  // operands_ points into sites_
  Fp8Products& operator=(const Fp8Products&) = delete;

  // out[N,OC] = fwd q(inp) q(W) + b
  virtual void forward(int site, float* out, const float* inp, const float* W, const float* b, int N, int IC, int OC,
                       const ops::ProductScales& s = {});
  // dinp (= or += with accumulate; may be null) grad_in q(dout) q(W)^T; dW += grad_w q(inp)^T q(dout);
  // db += sums of dout
  virtual void backward(int site, float* dinp, float* dW, float* db, const float* dout, const float* inp,
                        const float* W, int N, int IC, int OC, bool accumulate, const ops::ProductScales& s = {});
  // backward() in two halves, for a pipeline's B and W passes (the Zero Bubble split): the
  // input half dinp (= or +=) grad_in q(dout) q(W)^T, the weight half dW += grad_w q(inp)^T
  // q(dout) and db += sums of dout. Each quantizes the operands it reads at the step's
  // scales, so the halves give backward()'s bits and record its amax. They run the host
  // simulation's route on the kernels given (on CudaFp8Products too: fake-quantized operands,
  // fp32 products).
  void backward_input(int site, float* dinp, const float* dout, const float* W, int N, int IC, int OC, bool accumulate,
                      const ops::ProductScales& s = {});
  void backward_weight(int site, float* dW, float* db, const float* dout, const float* inp, int N, int IC, int OC,
                       const ops::ProductScales& s = {});
  // logits[N,V] = fwd q(inp) q(wte)^T, and its backward (dinp written, dwte accumulated)
  virtual void head_forward(float* logits, const float* inp, const float* wte, int N, int C, int V,
                            const ops::ProductScales& s = {});
  virtual void head_backward(float* dinp, float* dwte, const float* dlogits, const float* inp, const float* wte, int N,
                             int C, int V, const ops::ProductScales& s = {});

  // The scratch the products quantize into from now on (a pipeline layer's work buffer of the
  // call under way, models/gpt/pipeline_layers.h).
  void use_scratch(Scratch scratch) noexcept { scratch_ = scratch; }
  void set_recording(bool on) noexcept { recording_ = on; }
  // This step's amax of every operand (x, w, g of each site in turn; -1 where unused), for
  // the caller to reduce (max) over the data-parallel ranks before end_step(amax), so that
  // every rank scales alike. end_step() uses this rank's own.
  std::vector<float> step_amax();
  void end_step(const std::vector<float>& amax);
  void end_step() { end_step(step_amax()); }
  // Every operand's history (the order of step_amax), to be saved with a checkpoint, and
  // back; restore() throws naming what does not match this model.
  std::vector<std::vector<float>> histories() const;
  void restore(const std::vector<std::vector<float>>& histories);
  const Site& site(int i) const { return sites_.at(static_cast<std::size_t>(i)); }
  const fp8::Recipe& recipe() const noexcept { return recipe_; }

 protected:
  enum class Kind { activation, weight };
  // One operand of one site: its place in step_amax's order, its history, its format.
  struct Operand {
    int index;
    fp8::AmaxHistory* h;
    Kind kind;
    DType fmt;
  };
  Operand x_of(int site) { return operand(site, 0, Kind::activation, recipe_.forward_dtype()); }
  Operand w_of(int site) { return operand(site, 1, Kind::weight, recipe_.forward_dtype()); }
  Operand g_of(int site) { return operand(site, 2, Kind::activation, recipe_.gradient_dtype()); }
  int head_site() const noexcept { return head_site_; }
  bool recording() const noexcept { return recording_; }
  fp8::AmaxHistory& history(int index) { return *operands_.at(static_cast<std::size_t>(index)); }
  int operand_count() const noexcept { return static_cast<int>(operands_.size()); }
  GptKernels& kernels() noexcept { return k_; }
  // Quantizes rows x cols of src into dst, fp32 values of the codes, with the operand's scale
  // (or per block), recording its amax while recording; returns dst.
  virtual const float* quantize(const Operand& o, const float* src, int rows, int cols, float* dst);
  // Moves amax recorded elsewhere (device memory) into the histories' pending values.
  virtual void collect_amax() {}

 private:
  Operand operand(int site, int which, Kind kind, DType fmt);

  fp8::Recipe recipe_;
  int head_site_;
  Scratch scratch_;
  GptKernels& k_;
  std::vector<Site> sites_;
  std::vector<fp8::AmaxHistory*> operands_;  // x, w, g of each site in turn (step_amax's order)
  bool recording_ = false;
};

}  // namespace strata::model
