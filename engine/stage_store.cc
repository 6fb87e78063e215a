// The engine as a pipeline stage's ParameterStore (see stage_store.h).
#include "engine/stage_store.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "runtime/core/dtype.h"
#include "runtime/core/error.h"
#include "runtime/core/units.h"
#include "runtime/device/arena.h"
#include "runtime/device/device.h"
#include "runtime/device/ops.h"

namespace strata::engine {

namespace {
std::size_t elements(const std::vector<std::int64_t>& shape) {
  std::size_t n = 1;
  for (auto d : shape) n *= static_cast<std::size_t>(std::max<std::int64_t>(d, 0));
  return n;
}
}  // namespace

std::string StageStore::tensor_name(int layer) { return "pipeline.layer" + std::to_string(layer); }

StageStore::StageStore(Engine& engine, const pipeline::PipelineModel& model, std::vector<int> layers,
                       int pipeline_stages)
    : engine_(engine), model_(model), ids_(std::move(layers)) {
  // Muon tells hidden matrices by their layer's place among the engine's layers (the first and
  // the last are the embeddings' and the head's), which a stage of several cannot see.
  STRATA_CHECK(pipeline_stages <= 1 || engine.config().optimizer.type != OptimizerType::muon, Errc::unsupported,
               "optimizer.type = \"Muon\" in a ", pipeline_stages,
               "-stage pipeline: a stage's engine holds only its own layers and cannot tell the model's hidden "
               "matrices from its embeddings and head; use Muon without pipeline stages, or AdamW");
  // Clipping and the overflow skip must see every stage's gradients, or the stages would
  // step differently: the engines of a replica's stages are linked (EngineOptions::pipeline_comm).
  STRATA_CHECK(engine.pipeline_stages() == std::max(1, pipeline_stages), Errc::invalid_argument, "a stage of a ",
               pipeline_stages,
               "-stage pipeline needs its engine linked to the engines of its replica's other stages "
               "(EngineOptions::pipeline_comm over ",
               pipeline_stages,
               " ranks) so that gradient_clipping and the overflow skip see every stage's gradients; it is linked to ",
               engine.pipeline_stages());
  for (const auto& p : param_specs(model, ids_)) engine.register_param(p.name, p.shape, p.layer, {}, p.lr_scale);
}

std::vector<ParamSpec> StageStore::param_specs(const pipeline::PipelineModel& model, const std::vector<int>& layers) {
  std::vector<ParamSpec> out;
  for (int id : layers) {
    STRATA_CHECK(id >= 0 && static_cast<std::size_t>(id) < model.layers.size(), Errc::invalid_argument,
                 "pipeline stage: layer ", id, " is not a layer of a ", model.layers.size(), "-layer model");
    const std::size_t stored = model.stored_params(id);
    const auto named = model.layers[static_cast<std::size_t>(id)]->tensors();
    if (named.empty()) {
      ParamSpec p;
      p.name = tensor_name(id);
      p.shape = {static_cast<std::int64_t>(stored)};
      p.layer = id;
      out.push_back(std::move(p));
      continue;
    }
    // The layer's own tensors up to its tied tail (the owner's), which must be whole tensors.
    std::size_t at = 0;
    for (const auto& t : named) {
      if (at == stored) break;
      ParamSpec p;
      p.name = t.name;
      p.shape = t.shape;
      p.layer = id;
      p.lr_scale = t.lr_scale;
      at += elements(p.shape);
      out.push_back(std::move(p));
    }
    STRATA_CHECK(at == stored, Errc::internal, "pipeline stage: layer ", id, "'s tensors hold ", at,
                 " parameters up to its tied tail, and it stores ", stored);
  }
  return out;
}

std::size_t StageStore::count(int layer) const { return model_.stored_params(layer); }

// A layer's tensors lie back to back in the engine's layer buffer (layout.h): one view of them all.
TensorView StageStore::contiguous(const std::vector<TensorView>& views, int layer) const {
  STRATA_CHECK(!views.empty(), Errc::internal, "pipeline stage: layer ", layer, " has no tensors");
  TensorView whole = views.front();
  const std::size_t size = dtype_size(whole.dtype);
  for (std::size_t i = 1; i < views.size(); ++i) {
    const char* next = static_cast<const char*>(whole.data) + whole.numel * size;
    STRATA_CHECK(views[i].dtype == whole.dtype && views[i].data == next, Errc::internal, "pipeline stage: layer ",
                 layer, "'s tensor ", i, " does not follow the one before it");
    whole.numel += views[i].numel;
  }
  STRATA_CHECK(whole.numel == count(layer), Errc::internal, "pipeline stage: layer ", layer, " gathered ", whole.numel,
               " parameters, not the ", count(layer), " it stores");
  return whole;
}

void StageStore::init(std::uint64_t seed, const LayerValues& from) {
  struct Place {
    int layer;
    std::size_t offset;  // of the tensor's first element within its layer's parameters
  };
  std::map<std::string, Place> by_name;
  {
    std::map<int, std::size_t> at;
    for (const auto& p : param_specs(model_, ids_)) {
      by_name[p.name] = {p.layer, at[p.layer]};
      at[p.layer] += elements(p.shape);
    }
  }
  std::map<int, std::vector<float>> values;  // made once per layer, on first ask
  engine_.init_weights([&](const std::string& name, std::uint64_t elem, std::uint64_t n, float* out) {
    const auto it = by_name.find(name);
    STRATA_CHECK(it != by_name.end(), Errc::internal, "pipeline stage: the engine asks for '", name,
                 "', which this stage did not register");
    const int id = it->second.layer;
    auto& v = values[id];
    if (v.empty() && from) {
      v.resize(count(id));
      from(id, v.size(), v.data());
    } else if (v.empty()) {
      v.resize(model_.layers[id]->param_count());  // a tied tail is the owner's: not ours to keep
      model_.layers[id]->init_params(v.data(), seed, id);
      v.resize(count(id));
    }
    std::memcpy(out, v.data() + it->second.offset + elem, n * sizeof(float));
  });
}

std::uint64_t StageStore::conversion_bytes(const pipeline::PipelineModel& model, const std::vector<int>& layers,
                                           int layers_at_once, DType compute) {
  if (compute == DType::fp32) return 0;
  std::uint64_t largest = 0;
  for (int id : layers) largest = std::max<std::uint64_t>(largest, model.stored_params(id));
  return static_cast<std::uint64_t>(std::max(1, layers_at_once)) * device::Arena::round_up(largest * sizeof(float));
}

std::uint64_t StageStore::bound_bytes(const pipeline::PipelineModel& model, device::Backend backend) {
  if (backend != device::Backend::cuda || !model.bind || model.bind_bytes == 0) return 0;
  return 2 * device::Arena::round_up(model.bind_bytes);
}

std::uint64_t StageStore::reserved_bytes(const pipeline::StageMemory& activations, const pipeline::PipelineModel& model,
                                         const std::vector<int>& layers, int layers_at_once, DType compute,
                                         device::Backend backend) {
  return activations.pool_bytes() + conversion_bytes(model, layers, layers_at_once, compute) +
         bound_bytes(model, backend);
}

void StageStore::setup(const pipeline::StageMemory& activations, int layers_at_once, int stage, std::uint64_t seed,
                       const LayerValues& from) {
  device::Device& dev = engine_.device();
  const DType compute = compute_dtype_of(engine_.config());
  const std::uint64_t widen = conversion_bytes(model_, ids_, layers_at_once, compute);
  const std::uint64_t bound = bound_bytes(model_, dev.backend());
  const std::uint64_t activation_bytes =
      reserved_bytes(activations, model_, ids_, layers_at_once, compute, dev.backend());
  const std::uint64_t budget = dev.options().budget_bytes, used = dev.memory_stats().used_bytes;
  const std::string copies = widen > 0 ? "the fp32 copies of an action's layers" : "";
  const std::string kernels = bound > 0 ? "the scratch of the bound layers' kernels" : "";
  STRATA_CHECK(used + activation_bytes <= budget, Errc::out_of_budget, "pipeline stage ", stage,
               ": the schedule's activations", widen > 0 ? (bound > 0 ? ", " : " and ") + copies : "",
               bound > 0 ? " and " + kernels : "", " need ", format_bytes(activation_bytes), " (", activation_bytes,
               " B) of device memory (a slot for every buffer the schedule has live at once), and the device "
               "budget is ",
               format_bytes(budget), used > 0 ? str_cat(" with ", format_bytes(used), " already held") : std::string(),
               ": raise the device budget above ", format_bytes(used + activation_bytes),
               " plus the engine's minimum, re-materialize activations, or pick a schedule with fewer micro-batches "
               "live at once (1f1b, zb-h1)");
  // First, while the device is empty: blocks at its start, which the engine's buffers then
  // never fragment. The activations get a slot per buffer the schedule has live at once;
  // the fp32 copies, all freed after each action, an arena; the kernels of layers bound to
  // a CUDA stage's stream (the executor's and a forward pass's), an arena too.
  if (!activations.peak_by_size.empty())
    pool_ = std::make_unique<device::PoolDevice>(
        dev, activations.peak_by_size,
        str_cat("pipeline stage ", stage, " activations (slots counted by the schedule's replay)"));
  if (widen > 0)
    copies_ = std::make_unique<device::PoolDevice>(
        dev, widen, str_cat("pipeline stage ", stage, " fp32 weights (room for one action's layers)"));
  if (bound > 0)
    kernels_ = std::make_unique<device::PoolDevice>(
        dev, bound, str_cat("pipeline stage ", stage, " kernels' scratch (room for two binds of the layers)"));
  engine_.reserve_for_trainer(0, layers_at_once);
  try {
    engine_.setup();
  } catch (const Error& e) {
    if (e.code() != Errc::out_of_budget) throw;
    throw Error(e.code(), str_cat("pipeline stage ", stage, " (", format_bytes(activation_bytes),
                                  " reserved for the schedule's activations): ", e.what()));
  }
  init(seed, from);
}

void StageStore::begin_step() { engine_.begin_step(); }

void StageStore::before_action(const pipeline::Action&, const std::vector<int>& layers) {
  for (int id : layers) {
    const auto views = engine_.gather(id);
    const TensorView whole = contiguous(views, id);
    if (whole.dtype == DType::fp32) {
      held_[id] = whole.as<float>();
      continue;
    }
    // A 16-bit compute copy: the layers read fp32, widened exactly into a buffer of the
    // engine's device (setup reserved room for an action's layers).
    device::DeviceBuffer wide(copies_ ? *copies_ : engine_.device(), count(id) * sizeof(float),
                              "pipeline fp32 weights");
    device::convert_async(stream(), whole.data, whole.dtype, wide.get(), DType::fp32, count(id));
    held_[id] = wide.as<float>();
    widened_[id] = std::move(wide);
  }
  if (stream_) stream_->synchronize();  // the layers read them on the executor's stream
}

device::Stream& StageStore::stream() {
  if (!stream_) stream_ = engine_.device().create_stream();
  return *stream_;
}

const float* StageStore::parameters(int layer) {
  const auto it = held_.find(layer);
  STRATA_CHECK(it != held_.end(), Errc::internal, "pipeline stage: parameters(", layer,
               ") outside an action that gathered it");
  return it->second;
}

void StageStore::add_gradient(int layer, int micro, const float* dw) {
  (void)micro;  // the engine's reductions count micro-batches themselves, in call order
  STRATA_CHECK(held_.count(layer) == 1, Errc::internal, "pipeline stage: gradient of layer ", layer,
               " outside an action that gathered it");
  const TensorView grads = contiguous(engine_.grad_buffers(layer), layer);
  // Stream work (the CPU may not reach the device's memory); rounds to a 16-bit compute dtype.
  device::convert_async(stream(), dw, DType::fp32, grads.data, grads.dtype, count(layer));
  stream_->synchronize();  // the engine's reduction reads the buffer
  engine_.reduce_grads(layer);
}

void StageStore::after_action(const pipeline::Action&, const std::vector<int>& layers) {
  for (int id : layers) {
    engine_.release(id);
    held_.erase(id);
    widened_.erase(id);
  }
}

void StageStore::optimizer_step() { last_ = engine_.step(); }

float StageStore::loss_scale() { return engine_.loss_scale(); }

}  // namespace strata::engine
