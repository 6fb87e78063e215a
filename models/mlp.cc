// The demo MLP's forward and backward (see mlp.h). Arithmetic is in fp32 on parameters
// converted from the engine's compute dtype; gradients are written back in it.
#include "models/mlp.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

#include "models/detail/mlp_cuda.h"
#include "runtime/comm/communicator.h"
#include "runtime/core/error.h"
#include "runtime/device/device.h"
#include "runtime/device/ops.h"

namespace strata::model {
namespace {

void simulate(double ms) {
  if (ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
}

// A layer's gathered weight and bias as the layer's fp32 parameters [W, b]. The views are
// device memory, read here.
void gathered_params(device::Device& dev, const std::vector<engine::TensorView>& p, std::vector<float>& out) {
  out.resize(p[0].numel + p[1].numel);
  device::CpuAccessScope cpu(dev);
  convert(p[0].data, p[0].dtype, out.data(), DType::fp32, p[0].numel);
  convert(p[1].data, p[1].dtype, out.data() + p[0].numel, DType::fp32, p[1].numel);
}

}  // namespace

// The CUDA path's state: its stream (the cuBLAS handle is bound to it), fp32 activations of
// every layer of a micro-batch, the gradient flowing backward, and the converted parameters
// and parameter gradients of the layer at hand.
struct Mlp::Gpu {
  device::Device& dev;
  std::unique_ptr<device::Stream> stream;
  void* blas = nullptr;
  std::vector<device::DeviceBuffer> acts;  // [layers + 1][B, H]
  device::DeviceBuffer grad, din, w32, b32, dw32, db32;

  Gpu(device::Device& d, int layers, std::size_t batch, std::size_t hidden) : dev(d), stream(d.create_stream()) {
    const std::size_t act = batch * hidden * 4, mat = hidden * hidden * 4, vec = hidden * 4;
    for (int l = 0; l <= layers; ++l) acts.emplace_back(d, act, "mlp activations");
    grad = device::DeviceBuffer(d, act, "mlp activation gradient");
    din = device::DeviceBuffer(d, act, "mlp activation gradient");
    w32 = device::DeviceBuffer(d, mat, "mlp fp32 weight");
    b32 = device::DeviceBuffer(d, vec, "mlp fp32 bias");
    dw32 = device::DeviceBuffer(d, mat, "mlp fp32 weight gradient");
    db32 = device::DeviceBuffer(d, vec, "mlp fp32 bias gradient");
    blas = detail::cuda_blas_create(stream->native_handle());
  }
  ~Gpu() {
    try {
      stream->synchronize();
    } catch (...) {
    }
    detail::cuda_blas_destroy(blas);
  }
  float* act(int l) const { return acts[static_cast<std::size_t>(l)].as<float>(); }
};

Mlp::~Mlp() = default;

Mlp::Mlp(engine::Engine& engine, const MlpConfig& config, comm::Communicator* comm, Tracer* tracer)
    : engine_(engine), cfg_(config), comm_(comm), tracer_(tracer) {
  STRATA_CHECK(cfg_.layers >= 1 && cfg_.hidden >= 1, Errc::invalid_argument, "mlp: --layers ", cfg_.layers,
               " and --hidden ", cfg_.hidden, " must be >= 1");
  for (const auto& p : mlp_param_specs(cfg_)) engine_.register_param(p.name, p.shape, p.layer, p.init);
  for (int l : cfg_.frozen) {
    STRATA_CHECK(l >= 0 && l < cfg_.layers, Errc::invalid_argument, "mlp: frozen layer ", l, " is not one of the ",
                 cfg_.layers);
    engine_.freeze_layer(l);
  }
  for (int l = 0; l < cfg_.layers; ++l) layers_.emplace_back(cfg_, l);
  if (engine_.device().backend() == device::Backend::cuda) {
    gpu_ = std::make_unique<Gpu>(engine_.device(), cfg_.layers,
                                 static_cast<std::size_t>(engine_.config().train_micro_batch_size_per_gpu),
                                 static_cast<std::size_t>(cfg_.hidden));
  }
}

std::size_t Mlp::parameter_count() const noexcept {
  const auto h = static_cast<std::size_t>(cfg_.hidden);
  return static_cast<std::size_t>(cfg_.layers) * (h * h + h);
}

void Mlp::make_batch(std::int64_t step, int k, std::vector<float>& x, std::vector<float>& target) const {
  if (!data_) data_ = std::make_unique<const MlpData>(cfg_.hidden, cfg_.seed);
  const auto& c = engine_.config();
  const int micro = static_cast<int>(c.train_micro_batch_size_per_gpu);
  x.resize(static_cast<std::size_t>(micro) * static_cast<std::size_t>(cfg_.hidden));
  target.resize(x.size());
  data_->batch(step, c.train_batch_size, k, engine_.rank(), engine_.world_size(), micro, x.data(), target.data());
}

double Mlp::loss_and_grad(const float* y, const float* target, float* grad) const {
  return data_->loss_and_grad(
      y, target, grad, static_cast<std::size_t>(engine_.config().train_micro_batch_size_per_gpu), engine_.loss_scale());
}

// Through the layers the pipeline runs (mlp_layers.h): fp32 copies of each gathered layer,
// the gradient written back in the engine's dtype.
double Mlp::host_micro_batch(int k, const std::vector<float>& x, const std::vector<float>& target) {
  const std::size_t B = static_cast<std::size_t>(engine_.config().train_micro_batch_size_per_gpu);
  const std::size_t H = static_cast<std::size_t>(cfg_.hidden);
  const auto ids = engine_.layer_ids();
  const int L = static_cast<int>(ids.size());
  // acts[l] is layer l's input; acts[L] the output.
  std::vector<std::vector<float>> acts(L + 1), saved(L);
  acts[0] = x;
  std::vector<float> params;
  for (int l = 0; l < L; ++l) {
    const MlpLayer& layer = layers_[static_cast<std::size_t>(l)];
    gathered_params(engine_.device(), engine_.gather(ids[l]), params);
    Tracer::Span span(tracer_, "compute", "F L" + std::to_string(ids[l]) + " mb" + std::to_string(k));
    acts[l + 1].assign(B * H, 0.0f);
    saved[l].assign(layer.saved_floats(B), 0.0f);
    layer.forward(params.data(), acts[l].data(), acts[l + 1].data(), saved[l].data(), nullptr, B);  // no work
    engine_.release(ids[l]);
  }
  std::vector<float> grad(B * H), din(B * H), dparams(H * H + H);
  const double loss = loss_and_grad(acts[L].data(), target.data(), grad.data());
  // Backward: grad holds dL/d(layer output).
  for (int l = L - 1; l >= 0; --l) {
    const MlpLayer& layer = layers_[static_cast<std::size_t>(l)];
    gathered_params(engine_.device(), engine_.gather(ids[l]), params);
    const bool trains = !frozen(l);
    const auto g = trains ? engine_.grad_buffers(ids[l]) : std::vector<engine::TensorView>{};
    {
      Tracer::Span span(tracer_, "compute", "B L" + std::to_string(ids[l]) + " mb" + std::to_string(k));
      layer.backward(params.data(), acts[l].data(), saved[l].data(), grad.data(), din.data(), dparams.data(), nullptr,
                     B);
      device::CpuAccessScope cpu(engine_.device());
      if (trains) {
        convert(dparams.data(), DType::fp32, g[0].data, g[0].dtype, H * H);
        convert(dparams.data() + H * H, DType::fp32, g[1].data, g[1].dtype, H);
      }
    }
    grad.swap(din);
    if (trains) engine_.reduce_grads(ids[l]);
    engine_.release(ids[l]);
  }
  return loss;
}

// The same micro-batch on the GPU: every layer's work is on the MLP's stream, which is
// synchronized before the engine gets the layer back (release, reduce_grads).
double Mlp::cuda_micro_batch(int k, const std::vector<float>& x, const std::vector<float>& target) {
  auto& G = *gpu_;
  auto& st = *G.stream;
  const std::size_t B = static_cast<std::size_t>(engine_.config().train_micro_batch_size_per_gpu);
  const std::size_t H = static_cast<std::size_t>(cfg_.hidden);
  const auto ids = engine_.layer_ids();
  const int L = static_cast<int>(ids.size());
  st.copy_async(G.act(0), x.data(), B * H * 4, device::CopyKind::host_to_device);
  for (int l = 0; l < L; ++l) {
    const auto p = engine_.gather(ids[l]);
    Tracer::Span span(tracer_, "compute", "F L" + std::to_string(ids[l]) + " mb" + std::to_string(k));
    device::convert_async(st, p[0].data, p[0].dtype, G.w32.get(), DType::fp32, H * H);
    device::convert_async(st, p[1].data, p[1].dtype, G.b32.get(), DType::fp32, H);
    detail::cuda_mlp_forward(G.blas, st.native_handle(), G.w32.as<float>(), G.b32.as<float>(), G.act(l), G.act(l + 1),
                             B, H, l + 1 < L);
    st.synchronize();
    simulate(cfg_.layer_ms);
    engine_.release(ids[l]);
  }
  std::vector<float> y(B * H), grad(B * H);
  st.copy_async(y.data(), G.act(L), B * H * 4, device::CopyKind::device_to_host);
  st.synchronize();
  const double loss = loss_and_grad(y.data(), target.data(), grad.data());
  st.copy_async(G.grad.get(), grad.data(), B * H * 4, device::CopyKind::host_to_device);
  st.synchronize();
  for (int l = L - 1; l >= 0; --l) {
    const auto p = engine_.gather(ids[l]);
    const bool trains = !frozen(l);
    const auto g = trains ? engine_.grad_buffers(ids[l]) : std::vector<engine::TensorView>{};
    {
      Tracer::Span span(tracer_, "compute", "B L" + std::to_string(ids[l]) + " mb" + std::to_string(k));
      device::convert_async(st, p[0].data, p[0].dtype, G.w32.get(), DType::fp32, H * H);
      detail::cuda_mlp_backward(G.blas, st.native_handle(), G.w32.as<float>(), G.act(l), G.act(l + 1),
                                G.grad.as<float>(), G.dw32.as<float>(), G.db32.as<float>(), G.din.as<float>(), B, H,
                                l + 1 < L);
      if (trains) {
        device::convert_async(st, G.dw32.get(), DType::fp32, g[0].data, g[0].dtype, H * H);
        device::convert_async(st, G.db32.get(), DType::fp32, g[1].data, g[1].dtype, H);
      }
      st.synchronize();
      std::swap(G.grad, G.din);
      simulate(2 * cfg_.layer_ms);
    }
    if (trains) engine_.reduce_grads(ids[l]);
    engine_.release(ids[l]);
  }
  return loss;
}

bool Mlp::frozen(int l) const { return std::find(cfg_.frozen.begin(), cfg_.frozen.end(), l) != cfg_.frozen.end(); }

MlpStep Mlp::train_step(std::int64_t step) {
  const auto& c = engine_.config();
  const int accum = static_cast<int>(std::max<std::int64_t>(1, c.gradient_accumulation_steps));
  const std::size_t B = static_cast<std::size_t>(c.train_micro_batch_size_per_gpu);
  double loss_sum = 0.0;
  engine_.begin_step();
  std::vector<float> x, target;
  for (int k = 0; k < accum; ++k) {
    make_batch(step, k, x, target);
    loss_sum += gpu_ ? cuda_micro_batch(k, x, target) : host_micro_batch(k, x, target);
  }
  MlpStep out;
  out.result = engine_.step();
  out.loss = comm::mean_over_ranks(comm_, loss_sum / static_cast<double>(accum * B));
  return out;
}

}  // namespace strata::model
