// The forward-only loops a decoder trained through the engine runs between steps, written
// once for any pass with the GPT's forward-only calls (GptPass, LlamaPass):
// `loss(access, tokens, targets, B, T)` (the sum of the token losses) and
// `last_logits(access, tokens, B, T, out)`. Both open an evaluation window on the engine
// (begin_eval ... end_eval), so the weights are the step's and nothing is trained.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "engine/engine.h"
#include "models/gpt/data.h"
#include "models/gpt/gpt.h"
#include "models/gpt/pass.h"
#include "runtime/core/error.h"

namespace strata::model {

// Mean token loss over `batches` validation micro-batches of B x T (the same ones every call).
template <class Pass> double evaluate_batches(engine::Engine& engine, Pass& pass, LayerAccess& access,
                                              const Batcher& batcher, int batches, int B, int T) {
  std::vector<std::int32_t> in(static_cast<std::size_t>(B) * T), tg(in.size());
  double total = 0.0;
  engine.begin_eval();
  for (int v = 0; v < batches; ++v) {
    batcher.val_batch(v, B, in.data(), tg.data());
    total += pass.loss(access, in.data(), tg.data(), B, T);
  }
  engine.end_eval();
  return total / (static_cast<double>(batches) * B * T);
}

// `count` tokens generated after `prompt` over a window of at most seq_len tokens, each drawn
// by sample_token (gpt.h) at `temperature` keyed by seed + its index.
template <class Pass> std::vector<std::int32_t> sample_tokens(engine::Engine& engine, Pass& pass, LayerAccess& access,
                                                              const std::vector<std::int32_t>& prompt, int count,
                                                              float temperature, std::uint64_t seed, int vocab,
                                                              int seq_len) {
  STRATA_CHECK(!prompt.empty(), Errc::invalid_argument, "sample: the prompt needs at least one token");
  std::vector<std::int32_t> text = prompt;
  std::vector<float> logits(static_cast<std::size_t>(vocab));
  engine.begin_eval();
  for (int i = 0; i < count; ++i) {
    const int T = static_cast<int>(std::min<std::size_t>(text.size(), static_cast<std::size_t>(seq_len)));
    pass.last_logits(access, text.data() + text.size() - static_cast<std::size_t>(T), 1, T, logits.data());
    text.push_back(sample_token(logits.data(), vocab, temperature, seed + static_cast<std::uint64_t>(i)));
  }
  engine.end_eval();
  return {text.begin() + static_cast<std::ptrdiff_t>(prompt.size()), text.end()};
}

}  // namespace strata::model
