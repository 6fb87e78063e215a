// One forward (and backward) pass of a Llama-family decoder over a micro-batch, on the pass's
// device through its kernels (kernels.h: the host's or CUDA's): the embedding, the blocks, the
// final RMSNorm, the LM head (tied or not) and the loss. The pass owns the activations (one
// allocation on the device, inside its budget, sized for the largest micro-batch and sequence),
// the rotary tables and its kernels, never parameters: it asks a
// LayerAccess (models/gpt/pass.h) for each layer's weights and gradient accumulators, in the
// host-trainer contract's order: acquires 0, 1..L (forward), L+1 and, tied, 0 (the head),
// then L..1 and 0 (backward); a tied head's gradient stays open in layer 0's accumulators
// until the embedding's backward commits them.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "models/gpt/config.h"
#include "models/gpt/pass.h"
#include "models/llama/block.h"

namespace strata::device {
class Device;
}  // namespace strata::device

namespace strata::model {

class LlamaKernels;

class LlamaPass {
 public:
  LlamaPass(const LlamaShape& shape, int max_batch, int max_seq, Remat remat, device::Device& dev,
            ops::Products products = ops::Products::fp32);
  ~LlamaPass();
  LlamaPass(const LlamaPass&) = delete;
  LlamaPass& operator=(const LlamaPass&) = delete;

  // Device bytes the pass allocates (activations and temporaries); cuda: with the CUDA
  // kernels' scratch.
  static std::uint64_t device_bytes(const LlamaShape& shape, int max_batch, int max_seq, Remat remat,
                                    bool cuda = false);

  // Forward and backward: the sum of the B x T token losses; gradients are those of the mean
  // loss times loss_scale.
  double train(LayerAccess& access, const std::int32_t* tokens, const std::int32_t* targets, int B, int T,
               float loss_scale);
  // Forward only: the sum of the token losses.
  double loss(LayerAccess& access, const std::int32_t* tokens, const std::int32_t* targets, int B, int T);
  // Forward only: the logits of each sequence's last position, out[B, vocab].
  void last_logits(LayerAccess& access, const std::int32_t* tokens, int B, int T, float* out);
  // Where the pass's operations run; LayerAccess implementations convert and wait through
  // kernels().gpt().
  LlamaKernels& kernels() noexcept;

 private:
  struct Buffers;
  LlamaDims dims(int B, int T) const;
  int act_set(int block) const noexcept;
  bool recompute(int block) const noexcept;
  void forward_blocks(LayerAccess& access, const std::int32_t* tokens, const LlamaDims& d, bool keep);
  // The final norm over `rows` rows of x, the head and (with targets) the loss; with backward
  // the head's gradients and dres = dL/d(x).
  double head(LayerAccess& access, const float* x, int rows, const std::int32_t* targets, float grad_scale,
              bool backward, float* logits_out);

  LlamaShape shape_;
  Remat remat_;
  ops::Products products_;
  int max_B_, max_T_;
  int head_rows_ = 1;  // logits rows the head holds at once (head_chunk_rows)
  device::Device& dev_;
  std::unique_ptr<Buffers> buf_;
  std::unique_ptr<LlamaKernels> k_;  // destroyed first: it waits for work on buf_
};

}  // namespace strata::model
