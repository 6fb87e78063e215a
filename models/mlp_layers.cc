// The demo MLP's data, loss and layers (see mlp_layers.h).
#include "models/mlp_layers.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <thread>

#include "runtime/core/error.h"
#include "runtime/core/host_memory.h"
#include "runtime/core/random.h"
#include "runtime/core/units.h"

namespace strata::model {
namespace {

// Inputs and the teacher are keyed by seed and index: the same at any world size.
std::uint64_t mix(std::uint64_t x) { return splitmix64(x); }
float gaussian(std::uint64_t key) { return static_cast<float>(box_muller(mix(key), mix(key ^ 0x5bd1e995ull))); }

void simulate(double ms) {
  if (ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
}

}  // namespace

std::vector<engine::ParamSpec> mlp_param_specs(const MlpConfig& c) {
  const auto h = static_cast<std::int64_t>(c.hidden);
  std::vector<engine::ParamSpec> out;
  for (int l = 0; l < c.layers; ++l) {
    engine::ParamSpec w, b;
    w.name = "layers." + std::to_string(l) + ".weight";
    w.shape = {h, h};
    w.layer = l;
    w.init = {engine::InitKind::normal, static_cast<float>(1.0 / std::sqrt(static_cast<double>(h)))};
    b.name = "layers." + std::to_string(l) + ".bias";
    b.shape = {h};
    b.layer = l;
    b.init = {engine::InitKind::zeros, 0.0f};
    out.push_back(std::move(w));
    out.push_back(std::move(b));
  }
  return out;
}

MlpData::MlpData(int hidden, std::uint64_t seed) : H_(static_cast<std::size_t>(hidden)), seed_(seed) {
  const std::uint64_t bytes = static_cast<std::uint64_t>(H_) * H_ * 4;
  const HostMemory have = host_memory_available();
  STRATA_CHECK(bytes <= have.available, Errc::out_of_budget, "mlp: the teacher matrix of --hidden ", H_, " takes ",
               format_bytes(bytes), " but only ", format_bytes(have.available), " of host RAM is available (",
               have.source, "): use a smaller --hidden");
  teacher_.resize(H_ * H_);
  for (std::size_t i = 0; i < teacher_.size(); ++i) {
    teacher_[i] =
        gaussian(mix(seed_ ^ 0x7ea0c0ffeeull) + i) * static_cast<float>(2.0 / std::sqrt(static_cast<double>(H_)));
  }
}

void MlpData::batch(std::int64_t step, std::int64_t train_batch, int k, int rank, int world, int micro, float* x,
                    float* target) const {
  const std::size_t H = H_;
  for (std::int64_t j = 0; j < micro; ++j) {
    const auto s =
        static_cast<std::uint64_t>(step * train_batch + (static_cast<std::int64_t>(k) * world + rank) * micro + j);
    float* xs = x + j * H;
    for (std::size_t i = 0; i < H; ++i) xs[i] = gaussian(mix(seed_ ^ 0xda7aull) + s * H + i);
    if (target == nullptr) continue;
    for (std::size_t o = 0; o < H; ++o) {
      float z = 0;
      for (std::size_t i = 0; i < H; ++i) z += teacher_[o * H + i] * xs[i];
      target[j * H + o] = std::sin(z);
    }
  }
}

double MlpData::loss_and_grad(const float* y, const float* target, float* grad, std::size_t rows, float scale) const {
  const std::size_t H = H_;
  double loss = 0.0;
  for (std::size_t s = 0; s < rows; ++s) {
    for (std::size_t o = 0; o < H; ++o) {
      const float d = y[s * H + o] - target[s * H + o];
      loss += 0.5 * static_cast<double>(d) * d / static_cast<double>(H);
      grad[s * H + o] = d / static_cast<float>(H * rows) * scale;
    }
  }
  return loss;
}

MlpLayer::MlpLayer(const MlpConfig& c, int index)
    : H_(static_cast<std::size_t>(c.hidden)), index_(index), last_(index + 1 == c.layers), ms_(c.layer_ms), specs_([&] {
        auto all = mlp_param_specs(c);
        STRATA_CHECK(index >= 0 && index < c.layers, Errc::invalid_argument, "mlp: layer ", index,
                     " is not one of the ", c.layers);
        return std::vector<engine::ParamSpec>(all.begin() + 2 * index, all.begin() + 2 * index + 2);
      }()) {}

std::string MlpLayer::name() const { return "mlp.layers." + std::to_string(index_); }

void MlpLayer::init_params(float* params, std::uint64_t seed, int) const {
  engine::init_values(specs_[0], seed, 0, H_ * H_, params);
  engine::init_values(specs_[1], seed, 0, H_, params + H_ * H_);
}

void MlpLayer::forward(const float* p, const float* x, float* y, float* saved, float*, std::size_t rows) const {
  const std::size_t H = H_;
  const float *W = p, *b = p + H * H;
  for (std::size_t s = 0; s < rows; ++s) {
    const float* in = x + s * H;
    for (std::size_t o = 0; o < H; ++o) {
      float z = b[o];
      for (std::size_t i = 0; i < H; ++i) z += W[o * H + i] * in[i];
      y[s * H + o] = last_ ? z : std::tanh(z);
    }
  }
  if (!last_) std::copy(y, y + rows * H, saved);
  simulate(ms_);
}

// dz = dy * (1 - y^2) (tanh) replaces the saved output; dx[s, i] = sum over o of W[o, i] dz[s, o].
void MlpLayer::backward_input(const float* p, const float*, float* saved, const float* dy, float* dx, float*,
                              std::size_t rows) const {
  const std::size_t H = H_;
  const float* W = p;
  if (!last_)
    for (std::size_t i = 0; i < rows * H; ++i) saved[i] = dy[i] * (1.0f - saved[i] * saved[i]);
  const float* dz = last_ ? dy : saved;
  std::fill(dx, dx + rows * H, 0.0f);
  for (std::size_t s = 0; s < rows; ++s) {
    for (std::size_t o = 0; o < H; ++o) {
      const float d = dz[s * H + o];
      for (std::size_t i = 0; i < H; ++i) dx[s * H + i] += W[o * H + i] * d;
    }
  }
  simulate(ms_);
}

// dW[o, i] = sum over samples of dz[s, o] x[s, i]; db[o] = sum of dz[s, o], samples in order.
void MlpLayer::backward_weight(const float*, const float* x, const float* saved, const float* dy, float* dp, float*,
                               std::size_t rows) const {
  const std::size_t H = H_;
  const float* dz = last_ ? dy : saved;
  float *dW = dp, *db = dp + H * H;
  std::fill(dp, dp + H * H + H, 0.0f);
  for (std::size_t s = 0; s < rows; ++s) {
    for (std::size_t o = 0; o < H; ++o) {
      const float d = dz[s * H + o];
      db[o] += d;
      for (std::size_t i = 0; i < H; ++i) dW[o * H + i] += d * x[s * H + i];
    }
  }
  simulate(ms_);
}

MlpPipeline mlp_pipeline_model(const MlpConfig& c, int micro_batch, int micro_batches, int rank, int world,
                               std::shared_ptr<const MlpData> data) {
  STRATA_CHECK(c.layers >= 1 && c.hidden >= 1, Errc::invalid_argument, "mlp: --layers ", c.layers, " and --hidden ",
               c.hidden, " must be >= 1");
  STRATA_CHECK(micro_batch >= 1 && micro_batches >= 1 && world >= 1 && rank >= 0 && rank < world,
               Errc::invalid_argument, "MLP pipeline: micro-batch size ", micro_batch, ", ", micro_batches,
               " micro-batches and rank ", rank, " of ", world, " do not make a step");
  MlpPipeline g;
  g.losses = std::make_shared<std::vector<double>>(static_cast<std::size_t>(micro_batches), 0.0);
  auto& m = g.model;
  m.rows = static_cast<std::size_t>(micro_batch);
  for (int l = 0; l < c.layers; ++l) m.layers.push_back(std::make_shared<MlpLayer>(c, l));
  // Made before any stage runs: the stages' threads share it read-only.
  if (!data) data = std::make_shared<const MlpData>(c.hidden, c.seed);
  const std::int64_t train_batch = static_cast<std::int64_t>(micro_batch) * micro_batches * world;
  const std::size_t n = m.rows * static_cast<std::size_t>(c.hidden);
  m.input = [=](std::int64_t step, int micro, float* x) {
    data->batch(step, train_batch, micro, rank, world, micro_batch, x, nullptr);
  };
  auto losses = g.losses;
  m.loss_grad = [=](std::int64_t step, int micro, const float* y, float* dy, float loss_scale) {
    std::vector<float> x(n), target(n);
    data->batch(step, train_batch, micro, rank, world, micro_batch, x.data(), target.data());
    (*losses)[static_cast<std::size_t>(micro)] =
        data->loss_and_grad(y, target.data(), dy, static_cast<std::size_t>(micro_batch), loss_scale);
  };
  return g;
}

}  // namespace strata::model
