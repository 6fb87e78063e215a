// `strata estimate --lora-rank R [--lora-targets q_proj,v_proj]`: the registrations of a LoRA
// fine-tune of the model, as strata.torch registers a PEFT-wrapped model: every parameter of
// the model frozen (Engine::freeze_layer: compute dtype only, no gradient, no optimizer
// state) and, for each 2-D weight [out, in] whose name holds a target, adapters lora_A [R, in]
// and lora_B [out, R] in a trainable layer of their own beside the block's frozen one.
#pragma once

#include <string>
#include <vector>

#include "engine/layout.h"

namespace strata::train {

struct LoraShape {
  std::uint64_t adapted = 0;                // weights given adapters
  std::uint64_t trainable = 0, frozen = 0;  // elements
};

// Throws Errc::invalid_argument naming the targets when no weight matches, or a rank below 1.
LoraShape add_lora(std::vector<engine::ParamSpec>& params, int rank, const std::vector<std::string>& targets);

}  // namespace strata::train
