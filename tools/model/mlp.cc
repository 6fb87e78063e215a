// The demo MLP's forward and backward on host memory (see mlp.h). Arithmetic is in fp32 on
// parameters converted from the engine's compute dtype; gradients are written back in it.
#include "tools/model/mlp.h"

#include <chrono>
#include <cmath>
#include <thread>

#include "engine/comm/communicator.h"
#include "engine/core/error.h"
#include "engine/core/random.h"

namespace strata::model {
namespace {

// Inputs and the teacher are keyed by seed and index: the same at any world size.
std::uint64_t mix(std::uint64_t x) { return splitmix64(x); }
float gaussian(std::uint64_t key) { return static_cast<float>(box_muller(mix(key), mix(key ^ 0x5bd1e995ull))); }

void simulate(double ms) {
  if (ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
}

std::vector<float> to_float(const zero::TensorView& v) {
  std::vector<float> out(v.numel);
  convert(v.data, v.dtype, out.data(), DType::fp32, v.numel);
  return out;
}

}  // namespace

Mlp::Mlp(zero::Engine& engine, const MlpConfig& config, comm::Communicator* comm, Tracer* tracer)
    : engine_(engine), cfg_(config), comm_(comm), tracer_(tracer) {
  STRATA_CHECK(cfg_.layers >= 1 && cfg_.hidden >= 1, Errc::invalid_argument, "mlp: --layers ", cfg_.layers,
               " and --hidden ", cfg_.hidden, " must be >= 1");
  const auto h = static_cast<std::int64_t>(cfg_.hidden);
  for (int l = 0; l < cfg_.layers; ++l) {
    engine_.register_param("layers." + std::to_string(l) + ".weight", {h, h}, l,
                           {zero::InitKind::normal, static_cast<float>(1.0 / std::sqrt(static_cast<double>(h)))});
    engine_.register_param("layers." + std::to_string(l) + ".bias", {h}, l, {zero::InitKind::zeros, 0.0f});
  }
  teacher_.resize(static_cast<std::size_t>(h * h));
  for (std::size_t i = 0; i < teacher_.size(); ++i) {
    teacher_[i] = gaussian(mix(cfg_.seed ^ 0x7ea0c0ffeeull) + i) * static_cast<float>(2.0 / std::sqrt(static_cast<double>(h)));
  }
}

std::size_t Mlp::parameter_count() const noexcept {
  const auto h = static_cast<std::size_t>(cfg_.hidden);
  return static_cast<std::size_t>(cfg_.layers) * (h * h + h);
}

void Mlp::make_batch(std::int64_t step, int k, std::vector<float>& x, std::vector<float>& target) const {
  const auto& c = engine_.config();
  const std::int64_t micro = c.train_micro_batch_size_per_gpu, world = engine_.world_size();
  const std::size_t H = static_cast<std::size_t>(cfg_.hidden);
  x.resize(static_cast<std::size_t>(micro) * H);
  target.resize(x.size());
  for (std::int64_t j = 0; j < micro; ++j) {
    const std::uint64_t s = static_cast<std::uint64_t>(step * c.train_batch_size + (k * world + engine_.rank()) * micro + j);
    float* xs = x.data() + j * H;
    for (std::size_t i = 0; i < H; ++i) xs[i] = gaussian(mix(cfg_.seed ^ 0xda7aull) + s * H + i);
    for (std::size_t o = 0; o < H; ++o) {
      float z = 0;
      for (std::size_t i = 0; i < H; ++i) z += teacher_[o * H + i] * xs[i];
      target[j * H + o] = std::sin(z);
    }
  }
}

MlpStep Mlp::train_step(std::int64_t step) {
  const auto& c = engine_.config();
  const int accum = static_cast<int>(std::max<std::int64_t>(1, c.gradient_accumulation_steps));
  const std::size_t B = static_cast<std::size_t>(c.train_micro_batch_size_per_gpu);
  const std::size_t H = static_cast<std::size_t>(cfg_.hidden);
  const auto ids = engine_.layer_ids();
  const int L = static_cast<int>(ids.size());
  double loss_sum = 0.0;
  engine_.begin_step();
  std::vector<float> x, target;
  for (int k = 0; k < accum; ++k) {
    make_batch(step, k, x, target);
    // Forward: acts[l] is layer l's input; acts[L] the output.
    std::vector<std::vector<float>> acts(L + 1);
    acts[0] = x;
    for (int l = 0; l < L; ++l) {
      const auto p = engine_.gather(ids[l]);
      Tracer::Span span(tracer_, "compute", "F L" + std::to_string(ids[l]) + " mb" + std::to_string(k));
      const auto W = to_float(p[0]), b = to_float(p[1]);
      auto& out = acts[l + 1];
      out.assign(B * H, 0.0f);
      for (std::size_t s = 0; s < B; ++s) {
        const float* in = acts[l].data() + s * H;
        for (std::size_t o = 0; o < H; ++o) {
          float z = b[o];
          for (std::size_t i = 0; i < H; ++i) z += W[o * H + i] * in[i];
          out[s * H + o] = l + 1 < L ? std::tanh(z) : z;
        }
      }
      simulate(cfg_.layer_ms);
      engine_.release(ids[l]);
    }
    // Loss 0.5 * mean over samples of sum over outputs (y - t)^2 / H.
    std::vector<float> grad(B * H);
    const float scale = engine_.loss_scale();
    for (std::size_t s = 0; s < B; ++s) {
      for (std::size_t o = 0; o < H; ++o) {
        const float d = acts[L][s * H + o] - target[s * H + o];
        loss_sum += 0.5 * static_cast<double>(d) * d / static_cast<double>(H);
        grad[s * H + o] = d / static_cast<float>(H * B) * scale;
      }
    }
    // Backward: grad holds dL/d(layer output).
    for (int l = L - 1; l >= 0; --l) {
      const auto p = engine_.gather(ids[l]);
      const auto g = engine_.grad_buffers(ids[l]);
      {
        Tracer::Span span(tracer_, "compute", "B L" + std::to_string(ids[l]) + " mb" + std::to_string(k));
        const auto W = to_float(p[0]);
        const auto& in = acts[l];
        const auto& out = acts[l + 1];
        std::vector<float> dz(B * H), dW(H * H, 0.0f), db(H, 0.0f), din(B * H, 0.0f);
        for (std::size_t i = 0; i < B * H; ++i) dz[i] = l + 1 < L ? grad[i] * (1.0f - out[i] * out[i]) : grad[i];
        for (std::size_t s = 0; s < B; ++s) {
          for (std::size_t o = 0; o < H; ++o) {
            const float d = dz[s * H + o];
            db[o] += d;
            for (std::size_t i = 0; i < H; ++i) {
              dW[o * H + i] += d * in[s * H + i];
              din[s * H + i] += W[o * H + i] * d;
            }
          }
        }
        convert(dW.data(), DType::fp32, g[0].data, g[0].dtype, H * H);
        convert(db.data(), DType::fp32, g[1].data, g[1].dtype, H);
        grad.swap(din);
        simulate(2 * cfg_.layer_ms);
      }
      engine_.reduce_grads(ids[l]);
      engine_.release(ids[l]);
    }
  }
  MlpStep out;
  out.result = engine_.step();
  double loss = loss_sum / static_cast<double>(accum * B);
  if (comm_ != nullptr && comm_->world_size() > 1) {
    float l = static_cast<float>(loss);
    comm_->all_reduce(&l, 1, DType::fp32, comm::ReduceOp::avg);
    loss = l;
  }
  out.loss = loss;
  return out;
}

}  // namespace strata::model
