// The demo MLP's forward and backward (see mlp.h). Arithmetic is in fp32 on parameters
// converted from the engine's compute dtype; gradients are written back in it.
#include "models/mlp.h"

#include <chrono>
#include <cmath>
#include <thread>

#include "models/detail/mlp_cuda.h"
#include "runtime/comm/communicator.h"
#include "runtime/core/error.h"
#include "runtime/core/host_memory.h"
#include "runtime/core/random.h"
#include "runtime/core/units.h"
#include "runtime/device/device.h"
#include "runtime/device/ops.h"

namespace strata::model {
namespace {

// Inputs and the teacher are keyed by seed and index: the same at any world size.
std::uint64_t mix(std::uint64_t x) { return splitmix64(x); }
float gaussian(std::uint64_t key) { return static_cast<float>(box_muller(mix(key), mix(key ^ 0x5bd1e995ull))); }

void simulate(double ms) {
  if (ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
}

std::vector<float> to_float(const engine::TensorView& v) {
  std::vector<float> out(v.numel);
  convert(v.data, v.dtype, out.data(), DType::fp32, v.numel);
  return out;
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

std::vector<engine::ParamSpec> Mlp::param_specs(const MlpConfig& c) {
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

Mlp::Mlp(engine::Engine& engine, const MlpConfig& config, comm::Communicator* comm, Tracer* tracer)
    : engine_(engine), cfg_(config), comm_(comm), tracer_(tracer) {
  STRATA_CHECK(cfg_.layers >= 1 && cfg_.hidden >= 1, Errc::invalid_argument, "mlp: --layers ", cfg_.layers,
               " and --hidden ", cfg_.hidden, " must be >= 1");
  for (const auto& p : param_specs(cfg_)) engine_.register_param(p.name, p.shape, p.layer, p.init);
  if (engine_.device().backend() == device::Backend::cuda) {
    gpu_ = std::make_unique<Gpu>(engine_.device(), cfg_.layers,
                                 static_cast<std::size_t>(engine_.config().train_micro_batch_size_per_gpu),
                                 static_cast<std::size_t>(cfg_.hidden));
  }
}

// The teacher is made at the first batch, after engine.setup() has checked the model's
// state against the machine's memory; its own size is checked here.
const std::vector<float>& Mlp::teacher() const {
  if (!teacher_.empty()) return teacher_;
  const auto h = static_cast<std::uint64_t>(cfg_.hidden);
  const HostMemory have = host_memory_available();
  STRATA_CHECK(h * h * 4 <= have.available, Errc::out_of_budget, "mlp: the teacher matrix of --hidden ", h, " takes ",
               format_bytes(h * h * 4), " but only ", format_bytes(have.available), " of host RAM is available (",
               have.source, "): use a smaller --hidden");
  teacher_.resize(h * h);
  for (std::size_t i = 0; i < teacher_.size(); ++i) {
    teacher_[i] =
        gaussian(mix(cfg_.seed ^ 0x7ea0c0ffeeull) + i) * static_cast<float>(2.0 / std::sqrt(static_cast<double>(h)));
  }
  return teacher_;
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
    const std::uint64_t s =
        static_cast<std::uint64_t>(step * c.train_batch_size + (k * world + engine_.rank()) * micro + j);
    float* xs = x.data() + j * H;
    for (std::size_t i = 0; i < H; ++i) xs[i] = gaussian(mix(cfg_.seed ^ 0xda7aull) + s * H + i);
    const std::vector<float>& teacher = this->teacher();
    for (std::size_t o = 0; o < H; ++o) {
      float z = 0;
      for (std::size_t i = 0; i < H; ++i) z += teacher[o * H + i] * xs[i];
      target[j * H + o] = std::sin(z);
    }
  }
}

double Mlp::loss_and_grad(const float* y, const float* target, float* grad) const {
  const std::size_t B = static_cast<std::size_t>(engine_.config().train_micro_batch_size_per_gpu);
  const std::size_t H = static_cast<std::size_t>(cfg_.hidden);
  const float scale = engine_.loss_scale();
  double loss = 0.0;
  for (std::size_t s = 0; s < B; ++s) {
    for (std::size_t o = 0; o < H; ++o) {
      const float d = y[s * H + o] - target[s * H + o];
      loss += 0.5 * static_cast<double>(d) * d / static_cast<double>(H);
      grad[s * H + o] = d / static_cast<float>(H * B) * scale;
    }
  }
  return loss;
}

double Mlp::host_micro_batch(int k, const std::vector<float>& x, const std::vector<float>& target) {
  const std::size_t B = static_cast<std::size_t>(engine_.config().train_micro_batch_size_per_gpu);
  const std::size_t H = static_cast<std::size_t>(cfg_.hidden);
  const auto ids = engine_.layer_ids();
  const int L = static_cast<int>(ids.size());
  // Forward: acts[l] is layer l's input; acts[L] the output.
  std::vector<std::vector<float>> acts(L + 1);
  acts[0] = x;
  for (int l = 0; l < L; ++l) {
    const auto p = engine_.gather(ids[l]);
    Tracer::Span span(tracer_, "compute", "F L" + std::to_string(ids[l]) + " mb" + std::to_string(k));
    std::vector<float> W, b;
    {
      device::CpuAccessScope cpu(engine_.device());  // views are device memory, read here
      W = to_float(p[0]);
      b = to_float(p[1]);
    }
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
  std::vector<float> grad(B * H);
  const double loss = loss_and_grad(acts[L].data(), target.data(), grad.data());
  // Backward: grad holds dL/d(layer output).
  for (int l = L - 1; l >= 0; --l) {
    const auto p = engine_.gather(ids[l]);
    const auto g = engine_.grad_buffers(ids[l]);
    {
      Tracer::Span span(tracer_, "compute", "B L" + std::to_string(ids[l]) + " mb" + std::to_string(k));
      std::vector<float> W;
      {
        device::CpuAccessScope cpu(engine_.device());
        W = to_float(p[0]);
      }
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
      {
        device::CpuAccessScope cpu(engine_.device());
        convert(dW.data(), DType::fp32, g[0].data, g[0].dtype, H * H);
        convert(db.data(), DType::fp32, g[1].data, g[1].dtype, H);
      }
      grad.swap(din);
      simulate(2 * cfg_.layer_ms);
    }
    engine_.reduce_grads(ids[l]);
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
    const auto g = engine_.grad_buffers(ids[l]);
    {
      Tracer::Span span(tracer_, "compute", "B L" + std::to_string(ids[l]) + " mb" + std::to_string(k));
      device::convert_async(st, p[0].data, p[0].dtype, G.w32.get(), DType::fp32, H * H);
      detail::cuda_mlp_backward(G.blas, st.native_handle(), G.w32.as<float>(), G.act(l), G.act(l + 1),
                                G.grad.as<float>(), G.dw32.as<float>(), G.db32.as<float>(), G.din.as<float>(), B, H,
                                l + 1 < L);
      device::convert_async(st, G.dw32.get(), DType::fp32, g[0].data, g[0].dtype, H * H);
      device::convert_async(st, G.db32.get(), DType::fp32, g[1].data, g[1].dtype, H);
      st.synchronize();
      std::swap(G.grad, G.din);
      simulate(2 * cfg_.layer_ms);
    }
    engine_.reduce_grads(ids[l]);
    engine_.release(ids[l]);
  }
  return loss;
}

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
