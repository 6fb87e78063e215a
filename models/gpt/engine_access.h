// The LayerAccess (pass.h) of a model trained through the ZeRO engine: turns the engine's
// gathered compute-dtype views into fp32 weights and fp32 gradients into its gradient buffers.
// Used by the GPT and the Llama family alike. It holds two fp32 weight buffers (layer 0's and
// the largest other layer's: the head uses layer 0 and the last layer at once) when the
// compute dtype is not fp32, and two fp32 gradient buffers likewise. Conversions and zeroing
// go through the pass's kernels; their work is waited for before a layer goes back to the
// engine (release, reduce_grads), which may reuse its memory.
//
// bf16 views on the host device: each weight is shadowed by its view (gemm.h's Bf16Shadow)
// from acquire to release, so bf16 products on the acquiring thread read the engine's codes
// (valid until release, engine.h) instead of rounding the widened copy back. A parameter the
// model marks products-only (read by nothing but its bf16 weight products on that thread: no
// FP8, no other kernel) is not widened at all where bf16 products run: its fp32 slot is left
// unwritten (NaN in debug builds, so a reader breaking the rule shows) and the shadow alone
// serves it. A later acquire of the same buffer ends the shadows of what used it before.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/engine.h"
#include "models/gpt/config.h"
#include "models/gpt/gemm.h"
#include "models/gpt/pass.h"
#include "runtime/device/device.h"

namespace strata::model {

class GptKernels;

// Elements of each layer's parameters, in registration order, by layer.
using LayerNumels = std::vector<std::vector<std::size_t>>;
std::size_t layer_total(const std::vector<std::size_t>& numels);
// The largest of layers 1.. (every layer but the embeddings').
std::size_t largest_other_layer(const LayerNumels& n);
// Bytes of the parameters live at once in a pass at `compute`: the head's layers (the last and,
// when head_reads_layer0, the embeddings) or one block, plus the gradient buffer of the layer
// being reduced.
std::uint64_t live_window_bytes(const LayerNumels& n, DType compute, bool head_reads_layer0);

// Throws Errc::out_of_budget unless the engine's device has room for `need` bytes (a
// decoder's min_device_bytes: its activations plus the live window), naming the budget to
// raise and the knobs that shrink it. `window`: what the need is ("one GPT block's live
// window plus its activations"); `activations`: the activations' and buffers' part.
void require_device_room(engine::Engine& engine, std::uint64_t need, std::uint64_t activations, const char* window,
                         int micro_batch, int seq_len, Remat remat);

class EngineAccess : public LayerAccess {
 public:
  // products_only[layer][i]: parameter i of the layer is read only by bf16 weight products
  // (missing entries: false).
  EngineAccess(engine::Engine& engine, LayerNumels numels, GptKernels& kernels,
               std::vector<std::vector<bool>> products_only = {});
  // Device bytes of the conversion buffers for `numels` at `compute`.
  static std::uint64_t bytes(const LayerNumels& numels, DType compute);

  std::vector<const float*> acquire(int layer) override;
  void release(int layer) override;
  std::vector<float*> grads(int layer) override;
  void commit(int layer) override;

 private:
  bool products_only(int layer, std::size_t i) const noexcept;

  engine::Engine& engine_;
  GptKernels& k_;
  LayerNumels numels_;
  std::vector<bool> open_;
  bool convert_ = false;
  bool shadow_ = false;                                                 // host device: shadow bf16 views
  bool skip_widening_ = false;                                          // and bf16 products run here
  std::vector<std::vector<std::unique_ptr<ops::Bf16Shadow>>> shadows_;  // by layer, until release
  std::vector<std::vector<bool>> products_only_;
  device::DeviceBuffer w0_, wl_, g0_, gl_;
};

}  // namespace strata::model
