// PipelineModel checks, the local parameter store, the synthetic model and the sequential
// reference (see model.h).
#include "pipeline/model.h"

#include <algorithm>
#include <chrono>
#include <limits>

#include "pipeline/layers.h"
#include "pipeline/tie.h"
#include "runtime/core/error.h"
#include "runtime/device/device.h"

namespace strata::pipeline {

void PipelineModel::check(int virtual_stages) const {
  STRATA_CHECK(!layers.empty(), Errc::invalid_argument, "pipeline model has no layers");
  STRATA_CHECK(virtual_stages >= 1 && layers.size() % static_cast<std::size_t>(virtual_stages) == 0,
               Errc::invalid_argument, "pipeline model: ", layers.size(), " layers do not split evenly into ",
               virtual_stages, " virtual stages (stages x chunks); use a multiple of ", virtual_stages, " layers");
  for (std::size_t i = 0; i < layers.size(); ++i) {
    STRATA_CHECK(layers[i] != nullptr, Errc::invalid_argument, "pipeline model: layer ", i, " is null");
    if (i > 0) {
      STRATA_CHECK(layers[i - 1]->out_features() == layers[i]->in_features(), Errc::invalid_argument,
                   "pipeline model: layer ", i - 1, " gives ", layers[i - 1]->out_features(), " features but layer ", i,
                   " takes ", layers[i]->in_features());
    }
  }
  STRATA_CHECK(rows >= 1, Errc::invalid_argument, "pipeline model: rows per micro-batch must be >= 1");
  STRATA_CHECK(input && loss_grad, Errc::invalid_argument, "pipeline model: input and loss_grad must be set");
  if (!tie) return;
  const auto n = static_cast<int>(layers.size());
  STRATA_CHECK(tie->owner >= 0 && tie->owner < n && tie->user >= 0 && tie->user < n && tie->owner != tie->user,
               Errc::invalid_argument, "pipeline model: a tie between layers ", tie->owner, " and ", tie->user,
               " needs two different layers of the ", n);
  const Layer& owner = *layers[tie->owner];
  const Layer& user = *layers[tie->user];
  STRATA_CHECK(
      tie->count > 0 && tie->owner_offset + tie->count <= owner.param_count() && tie->count <= user.param_count(),
      Errc::invalid_argument, "pipeline model: a tie of ", tie->count, " parameters at offset ", tie->owner_offset,
      " does not fit layer ", tie->owner, " (", owner.param_count(), ") and layer ", tie->user, " (",
      user.param_count(), ")");
  STRATA_CHECK(!user.splits_backward(), Errc::invalid_argument, "pipeline model: layer ", tie->user, " (", user.name(),
               ") reads a tied weight and must not split its backward: its gradient goes to layer ", tie->owner,
               "'s stage during its B");
}

std::size_t PipelineModel::stored_params(int layer) const {
  const std::size_t n = layers[static_cast<std::size_t>(layer)]->param_count();
  return tie && tie->user == layer ? n - tie->count : n;
}

std::size_t PipelineModel::work_floats(const std::vector<std::vector<int>>& chunk_layers) const {
  std::size_t n = 0;
  for (const auto& ids : chunk_layers)
    for (int id : ids) n = std::max(n, layers[static_cast<std::size_t>(id)]->work_floats(rows));
  return n;
}

std::size_t PipelineModel::saved_floats(int id, device::Backend backend) const {
  if (backend == device::Backend::cuda && bind && bound_saved_floats) return bound_saved_floats(id, rows);
  return layers[static_cast<std::size_t>(id)]->saved_floats(rows);
}

std::vector<int> PipelineModel::layers_of(int vs, int virtual_stages) const {
  const int per = static_cast<int>(layers.size()) / virtual_stages;
  std::vector<int> ids(per);
  for (int i = 0; i < per; ++i) ids[i] = vs * per + i;
  return ids;
}

LocalParameterStore::LocalParameterStore(const PipelineModel& model, std::vector<int> layers, std::uint64_t seed,
                                         float sgd_lr)
    : ids_(std::move(layers)), lr_(sgd_lr) {
  for (int id : ids_) {
    STRATA_CHECK(id >= 0 && static_cast<std::size_t>(id) < model.layers.size(), Errc::invalid_argument,
                 "parameter store: layer ", id, " is not a layer of a ", model.layers.size(), "-layer model");
    const Layer& l = *model.layers[id];
    std::vector<float> p(l.param_count());
    l.init_params(p.data(), seed, id);
    p.resize(model.stored_params(id));
    params_.push_back(std::move(p));
    grads_.emplace_back(params_.back().size(), 0.0f);
  }
  ready_.assign(ids_.size(), 0);
}

std::size_t LocalParameterStore::index(int layer) const {
  const auto it = std::find(ids_.begin(), ids_.end(), layer);
  STRATA_CHECK(it != ids_.end(), Errc::invalid_argument, "parameter store: layer ", layer, " is not held here");
  return static_cast<std::size_t>(it - ids_.begin());
}

void LocalParameterStore::begin_step() {
  for (auto& g : grads_) std::fill(g.begin(), g.end(), 0.0f);
  std::fill(ready_.begin(), ready_.end(), 0);
}
const float* LocalParameterStore::parameters(int layer) { return params_[index(layer)].data(); }
void LocalParameterStore::add_gradient(int layer, int micro, const float* dw) {
  (void)micro;
  auto& g = grads_[index(layer)];
  accumulate(g.data(), dw, g.size());
}
void LocalParameterStore::gradients_ready(int layer) { ++ready_[index(layer)]; }
void LocalParameterStore::optimizer_step() {
  if (lr_ == 0) return;
  for (std::size_t i = 0; i < params_.size(); ++i)
    for (std::size_t k = 0; k < params_[i].size(); ++k) params_[i][k] -= lr_ * grads_[i][k];
}
const std::vector<float>& LocalParameterStore::params_of(int layer) const { return params_[index(layer)]; }
const std::vector<float>& LocalParameterStore::grads_of(int layer) const { return grads_[index(layer)]; }
int LocalParameterStore::ready_count(int layer) const { return ready_[index(layer)]; }

PipelineModel synthetic_model(const SyntheticModelSpec& spec) {
  PipelineModel m;
  m.rows = spec.rows;
  for (int i = 0; i < spec.layers; ++i) {
    if (spec.layer_time_s > 0) {
      const TimedLayer::Duration t(spec.layer_time_s);
      m.layers.push_back(std::make_shared<TimedLayer>(spec.width, t * spec.f, t * spec.b, t * spec.w));
    } else {
      const bool split = spec.unsplittable_every <= 0 || (i + 1) % spec.unsplittable_every != 0;
      m.layers.push_back(std::make_shared<TanhLinear>(spec.width, spec.width, split));
    }
  }
  const std::size_t n = spec.rows * spec.width;
  const std::uint64_t seed = spec.seed;
  const float scale = 1.0f / static_cast<float>(spec.rows * static_cast<std::size_t>(std::max(1, spec.micro_batches)));
  m.input = [n, seed](std::int64_t, int micro, float* x) {
    for (std::size_t i = 0; i < n; ++i) x[i] = hashed_uniform(seed ^ 0x1234, static_cast<std::uint64_t>(micro), i);
  };
  // Squared error against a hashed target: dL/dy = (y - t) / (rows m), times the loss scale.
  m.loss_grad = [n, seed, scale](std::int64_t, int micro, const float* y, float* dy, float loss_scale) {
    const float s = scale * loss_scale;
    for (std::size_t i = 0; i < n; ++i)
      dy[i] = (y[i] - 0.5f * hashed_uniform(seed ^ 0x5678, static_cast<std::uint64_t>(micro), i)) * s;
  };
  return m;
}

void run_sequential(const PipelineModel& model, int micro_batches, ParameterStore& plain, std::int64_t step) {
  model.check(1);
  std::vector<int> all(model.layers.size());
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
  std::unique_ptr<TiedStore> tied;
  if (model.tie) tied = std::make_unique<TiedStore>(plain, model, all, nullptr, -1);
  ParameterStore& store = tied ? static_cast<ParameterStore&>(*tied) : plain;
  const std::size_t rows = model.rows, n_layers = model.layers.size();
  // The layers' scratch, one call at a time, NaN on entry to each: a layer that reads scratch
  // it did not write in that call gives NaN here, not the executor's bits.
  std::vector<float> work;
  const auto fresh_work = [&](const Layer& layer) {
    work.assign(layer.work_floats(rows), std::numeric_limits<float>::quiet_NaN());
    return work.data();
  };
  store.begin_step();
  for (int mb = 0; mb < micro_batches; ++mb) {
    std::vector<std::vector<float>> x(n_layers + 1), saved(n_layers);
    x[0].resize(rows * model.layers[0]->in_features());
    model.input(step, mb, x[0].data());
    for (std::size_t l = 0; l < n_layers; ++l) {
      const Layer& layer = *model.layers[l];
      const std::vector<int> held{static_cast<int>(l)};
      const Action f{ActionKind::forward, mb};
      x[l + 1].resize(rows * layer.out_features());
      saved[l].resize(layer.saved_floats(rows));
      store.before_action(f, held);
      layer.forward(store.parameters(held[0]), x[l].data(), x[l + 1].data(), saved[l].data(), fresh_work(layer), rows);
      store.after_action(f, held);
    }
    std::vector<float> dy(x[n_layers].size());
    model.loss_grad(step, mb, x[n_layers].data(), dy.data(), store.loss_scale());
    for (std::size_t l = n_layers; l-- > 0;) {
      const Layer& layer = *model.layers[l];
      const int id = static_cast<int>(l);
      const Action bw{ActionKind::backward_full, mb};
      std::vector<float> dx(rows * layer.in_features()), dp(layer.param_count());
      store.before_action(bw, {id});
      if (layer.splits_backward()) {
        layer.backward_input(store.parameters(id), x[l].data(), saved[l].data(), dy.data(), dx.data(),
                             fresh_work(layer), rows);
        layer.backward_weight(store.parameters(id), x[l].data(), saved[l].data(), dy.data(), dp.data(),
                              fresh_work(layer), rows);
      } else {
        layer.backward(store.parameters(id), x[l].data(), saved[l].data(), dy.data(), dx.data(), dp.data(),
                       fresh_work(layer), rows);
      }
      store.add_gradient(id, mb, dp.data());
      store.after_action(bw, {id});
      dy = std::move(dx);
    }
  }
  for (std::size_t l = 0; l < n_layers; ++l) store.gradients_ready(static_cast<int>(l));
}

}  // namespace strata::pipeline
