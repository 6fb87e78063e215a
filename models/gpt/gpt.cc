// The GPT on the engine (see gpt.h): the LayerAccess that turns the engine's gathered
// compute-dtype views into fp32 weights and fp32 gradients into its gradient buffers, and the
// step, validation and generation loops.
#include "models/gpt/gpt.h"

#include <algorithm>
#include <cmath>

#include "models/gpt/decoder_loops.h"
#include "models/gpt/engine_access.h"
#include "models/gpt/kernels.h"
#include "models/gpt/pass.h"
#include "runtime/comm/communicator.h"
#include "runtime/core/error.h"
#include "runtime/core/random.h"
#include "runtime/core/units.h"
#include "runtime/device/device.h"

namespace strata::model {
namespace {

// Elements of each layer's parameters, in registration order.
std::vector<std::vector<std::size_t>> layer_numels(const GptShape& s) {
  std::vector<std::vector<std::size_t>> out(static_cast<std::size_t>(s.layers + 2));
  for (const auto& p : gpt_params(s)) {
    std::size_t n = 1;
    for (auto d : p.shape) n *= static_cast<std::size_t>(d);
    out[static_cast<std::size_t>(p.layer)].push_back(n);
  }
  return out;
}

// fp32 conversion buffers: layer 0's and the largest other layer's weights (when the compute
// dtype is not fp32), and the same two for gradients.
std::uint64_t access_bytes(const GptShape& s, DType compute) { return EngineAccess::bytes(layer_numels(s), compute); }

}  // namespace

std::uint64_t Gpt::min_device_bytes(const GptConfig& c, int micro_batch, DType compute, bool cuda) {
  const std::uint64_t live = live_window_bytes(layer_numels(c.shape), compute, true);
  return activation_bytes(c, micro_batch, compute, cuda) + live;
}

Gpt::Gpt(engine::Engine& engine, const GptConfig& config, const Batcher& batcher, comm::Communicator* comm,
         Tracer* tracer)
    : engine_(engine), cfg_(config), batcher_(batcher), comm_(comm), tracer_(tracer) {
  validate(cfg_);
  auto& dev = engine_.device();
  const bool cuda = dev.backend() == device::Backend::cuda;
  const int micro = static_cast<int>(engine_.config().train_micro_batch_size_per_gpu);
  require_device_room(engine_, min_device_bytes(cfg_, micro, engine_.compute_dtype(), cuda),
                      activation_bytes(cfg_, micro, engine_.compute_dtype(), cuda),
                      "one GPT block's live window plus its activations", micro, cfg_.seq_len, cfg_.remat);
  if (cfg_.unit_scaled) {
    const auto& ec = engine_.config();
    STRATA_CHECK(!(ec.fp16.enabled && ec.fp16.loss_scale == 0.0f), Errc::invalid_argument,
                 "--unit-scaled with fp16 and a dynamic loss scaler (fp16.loss_scale 0): a unit-scaled model trains "
                 "in fp16 with no loss scaling; set fp16.loss_scale to 1");
  }
  for (const auto& p : gpt_params(cfg_.shape, cfg_.unit_scaled, cfg_.seq_len))
    engine_.register_param(p.name, p.shape, p.layer, p.init, p.lr_scale);
  // The weight products take the compute dtype's operands with fp32 sums (bf16 where the CPU
  // has bf16 dot products, else fp32), as PyTorch's autocast runs linear layers.
  pass_ = std::make_unique<GptPass>(cfg_.shape, micro, cfg_.seq_len, cfg_.remat, dev,
                                    ops::products_for(engine_.compute_dtype()), cfg_.fp8, cfg_.unit_scaled);
  // Each block's four matrices feed only their products, unless FP8 products quantize them.
  std::vector<std::vector<bool>> products_only(static_cast<std::size_t>(cfg_.shape.layers + 2));
  if (!cfg_.fp8.enabled) {
    for (int l = 1; l <= cfg_.shape.layers; ++l) {
      auto& m = products_only[static_cast<std::size_t>(l)];
      m.assign(kBlockParams, false);
      for (int i : {qkv_w, attproj_w, fc_w, fcproj_w}) m[static_cast<std::size_t>(i)] = true;
    }
  }
  access_ =
      std::make_unique<EngineAccess>(engine_, layer_numels(cfg_.shape), pass_->kernels(), std::move(products_only));
}

Gpt::~Gpt() = default;

std::uint64_t Gpt::parameter_count() const noexcept { return gpt_parameter_count(cfg_.shape); }

std::uint64_t Gpt::activation_bytes() const noexcept {
  return activation_bytes(cfg_, static_cast<int>(engine_.config().train_micro_batch_size_per_gpu),
                          engine_.compute_dtype(), engine_.device().backend() == device::Backend::cuda);
}

std::uint64_t Gpt::activation_bytes(const GptConfig& c, int micro_batch, DType compute, bool cuda) noexcept {
  return GptPass::device_bytes(c.shape, micro_batch, c.seq_len, c.remat, c.fp8.enabled, cuda) +
         access_bytes(c.shape, compute);
}

std::vector<std::vector<float>> Gpt::fp8_state() const {
  return pass_->fp8() != nullptr ? pass_->fp8()->histories() : std::vector<std::vector<float>>{};
}

void Gpt::restore_fp8_state(const std::vector<std::vector<float>>& histories) {
  if (pass_->fp8() != nullptr) pass_->fp8()->restore(histories);
}

fp8::Recipe Gpt::fp8_recipe(const engine::Fp8Config& c) {
  fp8::Recipe r;
  r.enabled = c.enabled;
  r.format = fp8::parse_format(c.format);
  r.amax_history_len = c.amax_history_len;
  r.amax_compute = fp8::parse_amax_compute(c.amax_compute);
  r.margin = c.margin;
  r.block_scaling = c.block_scaling;
  r.scaling = fp8::parse_scaling(c.scaling);
  return r;
}

GptStep Gpt::train_step(std::int64_t step) {
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
  if (Fp8Products* fp8 = pass_->fp8()) {
    // Every rank scales alike: each operand's amax is the max over the global batch.
    std::vector<float> amax = fp8->step_amax();
    if (comm_ != nullptr && comm_->world_size() > 1)
      comm_->all_reduce(amax.data(), amax.size(), DType::fp32, comm::ReduceOp::max);
    fp8->end_step(amax);
  }
  out.loss = comm::mean_over_ranks(comm_, loss_sum / (static_cast<double>(accum) * B * T));
  return out;
}

double Gpt::evaluate(int batches) {
  return evaluate_batches(engine_, *pass_, *access_, batcher_, batches,
                          static_cast<int>(engine_.config().train_micro_batch_size_per_gpu), cfg_.seq_len);
}

int sample_token(const float* logits, int vocab, float temperature, std::uint64_t key) {
  const float mx = *std::max_element(logits, logits + vocab);
  std::vector<double> p(static_cast<std::size_t>(vocab));
  double total = 0.0;
  for (int v = 0; v < vocab; ++v) total += (p[static_cast<std::size_t>(v)] = std::exp((logits[v] - mx) / temperature));
  double u = unit_open(splitmix64(key)) * total;
  for (int v = 0; v < vocab; ++v) {
    u -= p[static_cast<std::size_t>(v)];
    if (u <= 0) return v;
  }
  return vocab - 1;
}

std::vector<std::int32_t> Gpt::sample(const std::vector<std::int32_t>& prompt, int count, float temperature,
                                      std::uint64_t seed) {
  return sample_tokens(engine_, *pass_, *access_, prompt, count, temperature, seed, cfg_.shape.vocab, cfg_.seq_len);
}

}  // namespace strata::model
