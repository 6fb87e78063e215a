// One forward (and backward) pass of the GPT over a micro-batch, on the pass's device
// through its kernels (kernels.h): the embedding, the blocks, the final LayerNorm, the tied
// LM head and the loss. The pass owns the
// activations and temporaries (one allocation on the device, inside its budget, sized for
// the largest micro-batch and sequence) and never owns parameters: it asks a LayerAccess for
// each layer's weights and gradient accumulators, in the host-trainer contract's order.
//
// LayerAccess protocol, per pass: acquire(layer) ... release(layer) brackets every use of a
// layer's weights (fp32 pointers in registration order, valid until release; a weight the
// access was told only bf16 products read may be served to them through a Bf16Shadow,
// gemm.h, its fp32 slot unwritten: engine_access.h). grads(layer)
// returns fp32 accumulators in the same order, zeroed at the first call since the layer's
// last commit; commit(layer) hands them over (the engine: convert, reduce). The order of
// acquires in a training pass is 0, 1..L (forward), L+1 and 0 (the head: ln_f and wte),
// then L..1 and 0 (backward); layer 0's gradients are opened by the head and committed
// after the embedding's backward.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "models/gpt/block.h"
#include "models/gpt/config.h"
#include "models/gpt/fp8_products.h"
#include "models/gpt/unit_scale.h"

namespace strata::device {
class Device;
}  // namespace strata::device

namespace strata::model {

class GptKernels;

class LayerAccess {
 public:
  virtual ~LayerAccess() = default;
  virtual std::vector<const float*> acquire(int layer) = 0;
  virtual void release(int layer) = 0;
  virtual std::vector<float*> grads(int layer) = 0;
  virtual void commit(int layer) = 0;
};

class GptPass {
 public:
  // Allocates the activations for micro-batches of up to max_batch x max_seq tokens on `dev`;
  // the weight products run in `products` precision (gemm.h), or, with fp8.enabled, with FP8
  // operands (fp8_products.h; their scratch is allocated beside the activations); unit_scaled:
  // the unit-scaled model (unit_scale.h), whose weights the LayerAccess holds at unit scale.
  GptPass(const GptShape& shape, int max_batch, int max_seq, Remat remat, device::Device& dev,
          ops::Products products = ops::Products::fp32, const fp8::Recipe& fp8 = {}, bool unit_scaled = false);
  ~GptPass();
  GptPass(const GptPass&) = delete;
  GptPass& operator=(const GptPass&) = delete;

  // Device bytes the pass allocates (activations and temporaries).
  // cuda: with the CUDA kernels' scratch.
  static std::uint64_t device_bytes(const GptShape& shape, int max_batch, int max_seq, Remat remat, bool fp8 = false,
                                    bool cuda = false);

  // Forward and backward: returns the sum of the B x T token losses; the gradients handed to
  // `access` are those of the mean loss times loss_scale (unit-scaled: times loss_scale and
  // one constant per tensor, unit_scale.h).
  double train(LayerAccess& access, const std::int32_t* tokens, const std::int32_t* targets, int B, int T,
               float loss_scale);
  // Forward only: the sum of the token losses.
  double loss(LayerAccess& access, const std::int32_t* tokens, const std::int32_t* targets, int B, int T);
  // Forward only: the logits of each sequence's last position, out[B, vocab].
  void last_logits(LayerAccess& access, const std::int32_t* tokens, int B, int T, float* out);
  // The FP8 products and their scaling state; null without FP8.
  Fp8Products* fp8() noexcept { return fp8_.get(); }
  const Fp8Products* fp8() const noexcept { return fp8_.get(); }
  // Where the pass's operations run; LayerAccess implementations convert and wait through it.
  GptKernels& kernels() noexcept;

 private:
  struct Buffers;
  BlockDims dims(int B, int T) const;     // checks B x T against the sizes allocated
  int act_set(int block) const noexcept;  // which BlockActs block `block` uses
  bool recompute(int block) const noexcept;
  void forward_blocks(LayerAccess& access, const std::int32_t* tokens, const BlockDims& d, bool keep);
  double head(LayerAccess& access, const std::int32_t* targets, const BlockDims& d, float grad_scale, bool backward);

  GptShape shape_;
  Remat remat_;
  ops::Products products_;
  BlockDims max_;
  int head_rows_ = 1;  // logits rows the head holds at once (pass.cc)
  device::Device& dev_;
  std::unique_ptr<Buffers> buf_;
  std::unique_ptr<GptKernels> k_;
  std::unique_ptr<Fp8Products> fp8_;
  std::unique_ptr<UnitScales> unit_;
};

}  // namespace strata::model
