// A Llama-family decoder trained through the ZeRO engine (the host-trainer contract), as the
// GPT is (models/gpt/gpt.h): registers Hugging Face's parameters (config.h), owns the pass's
// activations on the engine's device, draws each rank's micro-batches from the Batcher and
// runs a step: begin_step, every micro-batch's forward and backward (LlamaPass through an
// EngineAccess), step. Validation and generation are forward-only passes between steps.
//
// Protocol: construct (registers parameters and allocates activations: before
// engine.setup()), engine.setup(), load weights (engine.init_weights, or the registered
// initial values), then train_step(s) for s = 0, 1, ...; evaluate() and sample() between
// steps. On the host device or a CUDA one (the pass's kernels: kernels.h).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/engine.h"
#include "models/gpt/config.h"
#include "models/gpt/data.h"
#include "models/gpt/gpt.h"
#include "models/llama/config.h"
#include "models/safetensors.h"
#include "runtime/core/trace.h"

namespace strata::model {

// The model's own initial values (each parameter's init at `seed`, as the engine would fill
// it) grouped by engine layer in registration order: what ArrayAccess takes, for passes run
// without an engine (`strata bench llama`, strata_plan's profile).
std::vector<std::vector<NamedTensor>> llama_initial_params(const LlamaShape& s, std::uint64_t seed);

struct LlamaConfig {
  LlamaShape shape;
  int seq_len = 128;
  Remat remat = Remat::never;
};

class Llama {
 public:
  Llama(engine::Engine& engine, const LlamaConfig& config, const Batcher& batcher, comm::Communicator* comm = nullptr,
        Tracer* tracer = nullptr);
  ~Llama();
  Llama(const Llama&) = delete;
  Llama& operator=(const Llama&) = delete;

  GptStep train_step(std::int64_t step);
  double evaluate(int batches);
  std::vector<std::int32_t> sample(const std::vector<std::int32_t>& prompt, int count, float temperature,
                                   std::uint64_t seed);
  std::uint64_t activation_bytes() const noexcept;
  // cuda: on a CUDA device (the kernels' scratch counted).
  static std::uint64_t activation_bytes(const LlamaConfig& config, int micro_batch, DType compute,
                                        bool cuda = false) noexcept;
  // Smallest device budget one block's live window plus the activations need (stage 3).
  static std::uint64_t min_device_bytes(const LlamaConfig& config, int micro_batch, DType compute, bool cuda = false);

 private:
  engine::Engine& engine_;
  LlamaConfig cfg_;
  const Batcher& batcher_;
  comm::Communicator* comm_;
  Tracer* tracer_;
  std::unique_ptr<class LlamaPass> pass_;
  std::unique_ptr<class EngineAccess> access_;
};

}  // namespace strata::model
