// The GPT trained through the ZeRO engine (the host-trainer contract): registers its
// parameters (config.h), owns the pass's activations on the engine's device, draws each
// rank's micro-batches from the Batcher and runs a step: begin_step, every micro-batch's
// forward and backward (GptPass, with the engine's gathered weights converted to fp32 and
// fp32 gradients handed back in the compute dtype), step. Validation and generation are
// forward-only passes between steps (Engine::begin_eval).
//
// Protocol: construct (registers parameters and allocates activations: before
// engine.setup(), so the engine plans around them), engine.setup(), then train_step(s) for
// s = 0, 1, ...; evaluate() and sample() between steps. On the host device or a CUDA device
// (the pass's kernels, kernels.h), FP8 and unit scaling included.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "models/gpt/config.h"
#include "models/gpt/data.h"
#include "runtime/core/trace.h"

namespace strata::comm {
class Communicator;
}

namespace strata::model {

struct GptStep {
  double loss = 0.0;  // mean token loss over the whole step (every micro-batch of every rank)
  engine::StepResult result;
};

// The token drawn from `logits` (vocab of them) at `temperature`: softmax in double, then
// the first token whose cumulative weight reaches a uniform draw keyed by `key` (the same
// pick on every rank and stage that asks).
int sample_token(const float* logits, int vocab, float temperature, std::uint64_t key);

class Gpt {
 public:
  Gpt(engine::Engine& engine, const GptConfig& config, const Batcher& batcher, comm::Communicator* comm = nullptr,
      Tracer* tracer = nullptr);
  ~Gpt();
  Gpt(const Gpt&) = delete;
  Gpt& operator=(const Gpt&) = delete;

  GptStep train_step(std::int64_t step);
  // Mean token loss over `batches` validation micro-batches (the same ones every call).
  double evaluate(int batches);
  // `count` tokens generated after `prompt` (sampled at `temperature`, seeded).
  std::vector<std::int32_t> sample(const std::vector<std::int32_t>& prompt, int count, float temperature,
                                   std::uint64_t seed);

  std::uint64_t parameter_count() const noexcept;
  // Device bytes of activations, temporaries and fp32 conversion buffers.
  std::uint64_t activation_bytes() const noexcept;
  // cuda: on a CUDA device (its kernels' scratch counted).
  static std::uint64_t activation_bytes(const GptConfig& config, int micro_batch, DType compute,
                                        bool cuda = false) noexcept;
  // The config's fp8 block as the products' recipe (fp8.h).
  static fp8::Recipe fp8_recipe(const engine::Fp8Config& c);
  bool fp8_enabled() const noexcept { return cfg_.fp8.enabled; }
  // The FP8 products' amax histories (empty without FP8), for checkpoints, and back.
  std::vector<std::vector<float>> fp8_state() const;
  void restore_fp8_state(const std::vector<std::vector<float>>& histories);
  // Smallest device budget one block's live window plus the activations need (stage 3).
  static std::uint64_t min_device_bytes(const GptConfig& config, int micro_batch, DType compute, bool cuda = false);

 private:
  engine::Engine& engine_;
  GptConfig cfg_;
  const Batcher& batcher_;
  comm::Communicator* comm_;
  Tracer* tracer_;
  std::unique_ptr<class EngineAccess> access_;
  std::unique_ptr<class GptPass> pass_;
};

}  // namespace strata::model
