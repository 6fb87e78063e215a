// A Llama-family decoder on the engine (see llama.h): the step, validation and generation
// loops over LlamaPass and an EngineAccess.
#include "models/llama/llama.h"

#include <algorithm>

#include "engine/layout.h"
#include "models/gpt/decoder_loops.h"
#include "models/gpt/engine_access.h"
#include "models/llama/kernels.h"
#include "models/llama/pass.h"
#include "runtime/comm/communicator.h"
#include "runtime/core/error.h"
#include "runtime/core/units.h"
#include "runtime/device/device.h"

namespace strata::model {
namespace {

LayerNumels layer_numels(const LlamaShape& s) {
  LayerNumels out(static_cast<std::size_t>(s.layers + 2));
  for (const auto& p : llama_params(s)) {
    std::size_t n = 1;
    for (auto d : p.shape) n *= static_cast<std::size_t>(d);
    out[static_cast<std::size_t>(p.layer)].push_back(n);
  }
  return out;
}

}  // namespace

std::vector<std::vector<NamedTensor>> llama_initial_params(const LlamaShape& s, std::uint64_t seed) {
  std::vector<std::vector<NamedTensor>> out(static_cast<std::size_t>(s.layers + 2));
  for (const auto& p : llama_params(s)) {
    const engine::ParamSpec spec{p.name, p.shape, p.layer, p.init};
    std::size_t n = 1;
    for (auto d : p.shape) n *= static_cast<std::size_t>(d);
    std::vector<float> v(n);
    engine::init_values(spec, seed, 0, n, v.data());
    out[static_cast<std::size_t>(p.layer)].push_back({p.name, p.shape, std::move(v)});
  }
  return out;
}

std::uint64_t Llama::activation_bytes(const LlamaConfig& c, int micro_batch, DType compute, bool cuda) noexcept {
  return LlamaPass::device_bytes(c.shape, micro_batch, c.seq_len, c.remat, cuda) +
         EngineAccess::bytes(layer_numels(c.shape), compute);
}

std::uint64_t Llama::min_device_bytes(const LlamaConfig& c, int micro_batch, DType compute, bool cuda) {
  return activation_bytes(c, micro_batch, compute, cuda) +
         live_window_bytes(layer_numels(c.shape), compute, c.shape.tied);
}

Llama::Llama(engine::Engine& engine, const LlamaConfig& config, const Batcher& batcher, comm::Communicator* comm,
             Tracer* tracer)
    : engine_(engine), cfg_(config), batcher_(batcher), comm_(comm), tracer_(tracer) {
  validate_seq_len(cfg_.shape, cfg_.seq_len);
  auto& dev = engine_.device();
  const bool cuda = dev.backend() == device::Backend::cuda;
  const int micro = static_cast<int>(engine_.config().train_micro_batch_size_per_gpu);
  require_device_room(engine_, min_device_bytes(cfg_, micro, engine_.compute_dtype(), cuda),
                      activation_bytes(cfg_, micro, engine_.compute_dtype(), cuda),
                      "one block's live window plus the activations", micro, cfg_.seq_len, cfg_.remat);
  for (const auto& p : llama_params(cfg_.shape)) engine_.register_param(p.name, p.shape, p.layer, p.init);
  pass_ = std::make_unique<LlamaPass>(cfg_.shape, micro, cfg_.seq_len, cfg_.remat, dev,
                                      ops::products_for(engine_.compute_dtype()));
  // Each block's seven matrices feed only their products.
  std::vector<std::vector<bool>> products_only(static_cast<std::size_t>(cfg_.shape.layers + 2));
  const auto slots = llama_block_slots(cfg_.shape);
  for (int l = 1; l <= cfg_.shape.layers; ++l) {
    for (LlamaSlot slot : slots)
      products_only[static_cast<std::size_t>(l)].push_back(slot == q_w || slot == k_w || slot == v_w || slot == o_w ||
                                                           slot == gate_w || slot == up_w || slot == down_w);
  }
  access_ = std::make_unique<EngineAccess>(engine_, layer_numels(cfg_.shape), pass_->kernels().gpt(),
                                           std::move(products_only));
}

Llama::~Llama() = default;

std::uint64_t Llama::activation_bytes() const noexcept {
  return activation_bytes(cfg_, static_cast<int>(engine_.config().train_micro_batch_size_per_gpu),
                          engine_.compute_dtype(), engine_.device().backend() == device::Backend::cuda);
}

GptStep Llama::train_step(std::int64_t step) {
  const auto& c = engine_.config();
  const int accum = static_cast<int>(std::max<std::int64_t>(1, c.gradient_accumulation_steps));
  const int B = static_cast<int>(c.train_micro_batch_size_per_gpu), T = cfg_.seq_len;
  std::vector<std::int32_t> in(static_cast<std::size_t>(B) * T), tg(in.size());
  double loss_sum = 0.0;
  engine_.begin_step();
  for (int k = 0; k < accum; ++k) {
    batcher_.train_batch(step, c.train_batch_size, k, engine_.world_size(), engine_.rank(), B, in.data(), tg.data());
    Tracer::Span span(tracer_, "compute", str_cat("F+B mb", k));
    loss_sum += pass_->train(*access_, in.data(), tg.data(), B, T, engine_.loss_scale());
  }
  GptStep out;
  out.result = engine_.step();
  out.loss = comm::mean_over_ranks(comm_, loss_sum / (static_cast<double>(accum) * B * T));
  return out;
}

double Llama::evaluate(int batches) {
  return evaluate_batches(engine_, *pass_, *access_, batcher_, batches,
                          static_cast<int>(engine_.config().train_micro_batch_size_per_gpu), cfg_.seq_len);
}

std::vector<std::int32_t> Llama::sample(const std::vector<std::int32_t>& prompt, int count, float temperature,
                                        std::uint64_t seed) {
  return sample_tokens(engine_, *pass_, *access_, prompt, count, temperature, seed, cfg_.shape.vocab, cfg_.seq_len);
}

}  // namespace strata::model
