// The engine suites' host trainer (the model in stack_trainer.h).
#include "tests/engine/stack_trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <thread>

#include "runtime/comm/communicator.h"
#include "runtime/core/error.h"
#include "runtime/core/random.h"

namespace strata::test {

StackTrainer::StackTrainer(engine::Engine& engine, const StackConfig& config, comm::Communicator* comm, Tracer* tracer)
    : engine_(engine),
      cfg_(config),
      comm_(comm),
      tracer_(tracer),
      layer_(static_cast<std::size_t>(config.hidden), static_cast<std::size_t>(config.hidden)),
      stream_(engine.device().backend() == device::Backend::host ? nullptr : engine.device().create_stream()) {
  const auto h = static_cast<std::int64_t>(cfg_.hidden);
  for (int l = 0; l < cfg_.layers; ++l) {
    const std::string name = "layers." + std::to_string(l);
    engine_.register_param(name + ".weight", {h, h}, l,
                           {engine::InitKind::normal, static_cast<float>(1.0 / std::sqrt(static_cast<double>(h)))});
    engine_.register_param(name + ".bias", {h}, l, {engine::InitKind::zeros, 0.0f});
  }
  for (int l : cfg_.frozen) engine_.freeze_layer(l);
}

bool StackTrainer::frozen(int l) const {
  return std::find(cfg_.frozen.begin(), cfg_.frozen.end(), l) != cfg_.frozen.end();
}

void StackTrainer::batch(std::int64_t step, int k, std::vector<float>& x, std::vector<float>& target) const {
  const auto& c = engine_.config();
  const auto micro = static_cast<std::int64_t>(c.train_micro_batch_size_per_gpu);
  const auto H = static_cast<std::size_t>(cfg_.hidden);
  const std::int64_t first = step * c.train_batch_size + (k * engine_.world_size() + engine_.rank()) * micro;
  x.resize(static_cast<std::size_t>(micro) * H);
  target.resize(x.size());
  for (std::int64_t i = 0; i < micro; ++i) {
    float* xi = x.data() + static_cast<std::size_t>(i) * H;
    const std::uint64_t key = splitmix64(cfg_.seed ^ splitmix64(static_cast<std::uint64_t>(first + i)));
    for (std::size_t j = 0; j < H; ++j) xi[j] = static_cast<float>(unit_open(splitmix64(key + j)));
    for (std::size_t j = 0; j < H; ++j)  // mostly a fixed output: a few steps of Adam already fit some of it
      target[static_cast<std::size_t>(i) * H + j] = 0.6f * std::sin(static_cast<float>(j + 1)) + 0.2f * xi[j];
  }
}

// A layer's views (device memory) as fp32 host values, concatenated. On the host device the
// trainer computes where the views are (CpuAccessScope), as a GPU's kernels would on a GPU:
// nothing crosses the modelled link.
void StackTrainer::to_host(const std::vector<engine::TensorView>& views, std::vector<float>& out) {
  std::size_t n = 0;
  for (const auto& v : views) n += v.numel;
  out.resize(n);
  float* dst = out.data();
  for (const auto& v : views) {
    if (stream_ == nullptr) {
      device::CpuAccessScope cpu(engine_.device());
      convert(v.data, v.dtype, dst, DType::fp32, v.numel);
    } else {
      const std::size_t bytes = v.numel * dtype_size(v.dtype);
      narrow_.resize(bytes);
      stream_->copy_async(narrow_.data(), v.data, bytes, device::CopyKind::device_to_host);
      stream_->synchronize();
      convert(narrow_.data(), v.dtype, dst, DType::fp32, v.numel);
    }
    dst += v.numel;
  }
}

void StackTrainer::to_device(const std::vector<float>& values, const std::vector<engine::TensorView>& views) {
  const float* src = values.data();
  for (const auto& v : views) {
    if (stream_ == nullptr) {
      device::CpuAccessScope cpu(engine_.device());
      convert(src, DType::fp32, v.data, v.dtype, v.numel);
    } else {
      narrow_.resize(v.numel * dtype_size(v.dtype));
      convert(src, DType::fp32, narrow_.data(), v.dtype, v.numel);
      stream_->copy_async(v.data, narrow_.data(), narrow_.size(), device::CopyKind::host_to_device);
      stream_->synchronize();
    }
    src += v.numel;
  }
}

double StackTrainer::micro_batch(int k, const std::vector<float>& x, const std::vector<float>& target) {
  const auto B = static_cast<std::size_t>(engine_.config().train_micro_batch_size_per_gpu);
  const auto H = static_cast<std::size_t>(cfg_.hidden);
  const auto ids = engine_.layer_ids();
  const int L = static_cast<int>(ids.size());
  auto compute = [&](const char* pass, int l) {
    return Tracer::Span(tracer_, "compute",
                        std::string(pass) + " L" + std::to_string(ids[l]) + " mb" + std::to_string(k));
  };
  auto simulate = [](double ms) {
    if (ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
  };
  // acts[l] is layer l's input, acts[L] the output; saved[l] what layer l's backward reads.
  std::vector<std::vector<float>> acts(L + 1), saved(L);
  acts[0] = x;
  std::vector<float> params, work(layer_.work_floats(B));
  for (int l = 0; l < L; ++l) {
    to_host(engine_.gather(ids[l]), params);
    {
      auto span = compute("F", l);
      acts[l + 1].assign(B * H, 0.0f);
      saved[l].assign(layer_.saved_floats(B), 0.0f);
      layer_.forward(params.data(), acts[l].data(), acts[l + 1].data(), saved[l].data(), work.data(), B);
      simulate(cfg_.layer_ms);
    }
    engine_.release(ids[l]);
  }
  // dL/dy of the micro-batch's mean, times the loss scale.
  const float* y = acts[L].data();
  std::vector<float> dy(B * H), dx(B * H), dparams(layer_.param_count());
  double loss = 0.0;
  const double scale = engine_.loss_scale() / static_cast<double>(B * H);
  for (std::size_t i = 0; i < B * H; ++i) {
    const double d = static_cast<double>(y[i]) - static_cast<double>(target[i]);
    loss += 0.5 * d * d / static_cast<double>(H);
    dy[i] = static_cast<float>(d * scale);
  }
  for (int l = L - 1; l >= 0; --l) {
    to_host(engine_.gather(ids[l]), params);
    const bool trains = !frozen(l);
    {
      auto span = compute("B", l);
      layer_.backward(params.data(), acts[l].data(), saved[l].data(), dy.data(), dx.data(), dparams.data(), work.data(),
                      B);
      simulate(2 * cfg_.layer_ms);
    }
    if (trains) {
      to_device(dparams, engine_.grad_buffers(ids[l]));
      engine_.reduce_grads(ids[l]);
    }
    engine_.release(ids[l]);
    dy.swap(dx);
  }
  return loss;
}

StackStep StackTrainer::train_step(std::int64_t step) {
  const auto& c = engine_.config();
  const int accum = static_cast<int>(std::max<std::int64_t>(1, c.gradient_accumulation_steps));
  double loss_sum = 0.0;
  engine_.begin_step();
  std::vector<float> x, target;
  for (int k = 0; k < accum; ++k) {
    batch(step, k, x, target);
    loss_sum += micro_batch(k, x, target);
  }
  StackStep out;
  out.result = engine_.step();
  out.loss = comm::mean_over_ranks(comm_, loss_sum / static_cast<double>(accum * c.train_micro_batch_size_per_gpu));
  return out;
}

}  // namespace strata::test
