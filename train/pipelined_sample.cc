// Sampling from a pipelined GPT (see pipelined_sample.h).
#include "train/pipelined_sample.h"

#include <algorithm>

#include "models/gpt/gpt.h"
#include "pipeline/forward.h"
#include "runtime/core/error.h"

namespace strata::train {

std::vector<std::int32_t> sample_pipelined(StageRunner& runner, const PipelinedModel& model, int stages, int stage,
                                           int count, std::uint64_t seed, const model::Fp8Products* fp8) {
  STRATA_CHECK(model.at_length != nullptr, Errc::invalid_argument,
               "--sample: this model does not generate text (the GPT and the Llama family do): drop --sample");
  STRATA_CHECK(count >= 0 && static_cast<std::uint64_t>(count) <= 0x7fffffffu - pipeline::kForwardTagEnd,
               Errc::invalid_argument, "--sample ", count, " must be between 0 and ",
               0x7fffffffu - pipeline::kForwardTagEnd);
  const int last = stages - 1, V = model.vocab;
  const std::uint64_t key = seed ^ 0x73616d706c65ull;  // the plain trainer's
  std::vector<std::int32_t> text = model.prompt;
  for (int i = 0; i < count; ++i) {
    const int T = static_cast<int>(std::min<std::size_t>(text.size(), static_cast<std::size_t>(model.seq_len)));
    const pipeline::PipelineModel at = model.at_length(T, fp8);
    const std::int32_t* window = text.data() + text.size() - static_cast<std::size_t>(T);
    std::int32_t pick = -1;
    runner.forward(
        1, [&](int, float* x) { std::transform(window, window + T, x, [](std::int32_t t) { return float(t); }); },
        [&](int, const float* logits) {
          pick = model::sample_token(logits + static_cast<std::size_t>(T - 1) * static_cast<std::size_t>(V), V, 0.8f,
                                     key + static_cast<std::uint64_t>(i));
        },
        &at);
    const std::uint32_t tag = pipeline::kForwardTagEnd + static_cast<std::uint32_t>(i);
    if (stage == last) {
      for (int st = 0; st < last; ++st) runner.transport().send(st, tag, &pick, sizeof pick);
    } else {
      runner.transport().recv(last, tag, &pick, sizeof pick);
    }
    STRATA_CHECK(pick >= 0 && pick < V, Errc::internal, "--sample: stage ", stage, " got token ", pick, " of ", V);
    text.push_back(pick);
  }
  runner.transport().flush();
  return {text.begin() + static_cast<std::ptrdiff_t>(model.prompt.size()), text.end()};
}

}  // namespace strata::train
