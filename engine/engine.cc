// Engine setup, the optimizer step and queries (the protocol is in engine.h; reductions
// are in reduce.cc, stage-3 gathers in gather.cc).
#include "engine/engine.h"

#include <chrono>
#include <cmath>
#include <cstring>

#include "engine/detail/engine_impl.h"
#include "optim/adagrad.h"
#include "optim/adam.h"
#include "optim/device_step.h"
#include "optim/grad_norm.h"
#include "optim/lion.h"
#include "optim/step_plan.h"
#include "runtime/comm/communicator.h"
#include "runtime/core/error.h"
#include "runtime/core/log.h"
#include "runtime/core/units.h"

namespace strata::engine {
namespace {

optim::LossScalerConfig scaler_config(const EngineConfig& c) {
  if (!c.fp16.enabled) {
    optim::LossScalerConfig s;
    s.dynamic = false;
    s.static_scale = 1.0;
    return s;
  }
  return optim::loss_scaler_config_from_deepspeed(c.fp16.loss_scale, c.fp16.initial_scale_power,
                                                  c.fp16.loss_scale_window, c.fp16.hysteresis, c.fp16.min_loss_scale);
}

}  // namespace

Engine::Impl::Impl(const EngineOptions& o)
    : options(o), dev(*o.device), comm(o.comm), dcomm(o.device_comm), scaler(scaler_config(o.config)) {
  if (comm != nullptr) {
    rank = comm->rank();
    world = comm->world_size();
  }
  STRATA_CHECK(dcomm == nullptr || (comm != nullptr && dcomm->rank() == rank && dcomm->world_size() == world),
               Errc::invalid_argument, "EngineOptions.device_comm (rank ", dcomm ? dcomm->rank() : -1, " of ",
               dcomm ? dcomm->world_size() : 0, ") must join the same ranks as EngineOptions.comm (rank ", rank, " of ",
               world, ")");
  cdt = cfg.bf16 ? DType::bf16 : cfg.fp16.enabled ? DType::fp16 : DType::fp32;
  cbytes = dtype_size(cdt);
  STRATA_CHECK(cfg.zero.stage >= 0 && cfg.zero.stage <= 3, Errc::invalid_argument,
               "zero_optimization.stage = ", cfg.zero.stage, ": use 0, 1, 2 or 3");
  STRATA_CHECK(cfg.offload_param.device == OffloadDevice::none || cfg.zero.stage == 3, Errc::invalid_argument,
               "offload_param.device needs zero_optimization.stage 3 (only stage 3 partitions parameters); stage is ",
               cfg.zero.stage);
  STRATA_CHECK(cfg.offload_optimizer.device != OffloadDevice::nvme || cfg.zero.stage >= 1, Errc::invalid_argument,
               "offload_optimizer.device = \"nvme\" needs zero_optimization.stage 1, 2 or 3; stage is ",
               cfg.zero.stage);
  // Collectives on device memory need a communicator that reaches it (NCCL): Gloo's work
  // on host memory only.
  STRATA_CHECK(dev.backend() == device::Backend::host || world == 1 || dcomm != nullptr, Errc::invalid_argument,
               "rank ", rank, ": the ZeRO engine on a CUDA device ('", dev.name(), "') with ", world,
               " ranks needs EngineOptions.device_comm, a communicator on device memory (NCCL; `strata launch -- "
               "strata train --device cuda` creates one)");
  STRATA_CHECK(dev.backend() == device::Backend::host || dcomm == nullptr || dcomm->backend() == comm::Backend::nccl,
               Errc::invalid_argument, "rank ", rank,
               ": EngineOptions.device_comm is a gloo communicator, which "
               "cannot reach the memory of a CUDA device ('",
               dev.name(), "'): use an NCCL communicator");
}

std::uint64_t Engine::Impl::device_scratch_bytes() const {
  if (!device_collectives()) return 0;
  std::uint64_t max_bucket = 0, max_shard = 0;
  for (const auto& b : layout->buckets()) {
    max_bucket = std::max<std::uint64_t>(max_bucket, b.padded);
    max_shard = std::max<std::uint64_t>(max_shard, b.shard);
  }
  return (max_bucket + max_shard) * 4;
}

std::size_t Engine::Impl::copy_elems(int li) const {
  return cfg.zero.stage == 0 ? layout->layers()[li].padded : layers[li].shard_total;
}

std::size_t Engine::Impl::copy_offset(int li, std::size_t k) const {
  const auto& L = layout->layers()[li];
  return cfg.zero.stage == 0 ? bucket_pos(layout->buckets()[L.buckets[k]], L) : layers[li].shard_off[k];
}

void Engine::Impl::fill_zero(void* p, std::size_t bytes, Tier tier) {
  if (tier == Tier::device)
    dev_stream->memset_async(p, 0, bytes);
  else
    std::memset(p, 0, bytes);
}

void Engine::Impl::copy_bytes(void* dst, Tier dst_tier, const void* src, Tier src_tier, std::size_t bytes) {
  if (dst_tier != Tier::device && src_tier != Tier::device) {
    std::memcpy(dst, src, bytes);
    return;
  }
  const auto kind = dst_tier != Tier::device   ? device::CopyKind::device_to_host
                    : src_tier != Tier::device ? device::CopyKind::host_to_device
                                               : device::CopyKind::device_to_device;
  dev_stream->copy_async(dst, src, bytes, kind);
}

// The device optimizer wrote the layer's updated compute copies to device_copy (its shards
// live on the host or NVMe): they go to the host shards, or through the staging to NVMe.
void Engine::Impl::flush_device_copy(int li) {
  auto& S = layers[li];
  if (S.device_copy == nullptr) return;
  void* staged = copy_target(li);
  const std::size_t bytes = S.shard_total * cbytes;
  {
    Tracer::Span span(options.tracer, "copy", str_cat("D2H updated L", layout->layers()[li].id));
    dev_stream->copy_async(staged != nullptr ? staged : S.params_shard, S.device_copy, bytes,
                           device::CopyKind::device_to_host);
    dev_stream->synchronize();
  }
  io.d2h_bytes += bytes;
  ledger->free(S.device_copy);
  S.device_copy = nullptr;
  if (staged != nullptr) copy_updated(li, S.shard_total);
}

void Engine::Impl::settle(std::initializer_list<device::Stream*> streams, const char* when) noexcept {
  for (auto* st : streams) {
    if (st == nullptr) continue;
    try {
      st->synchronize();
    } catch (const std::exception& e) {
      if (*when != '\0') STRATA_LOG(warn, "rank ", rank, ": ", when, ": ", e.what());
    }
  }
}

void Engine::Impl::require_setup(const char* op) const {
  STRATA_CHECK(setup_done(), Errc::invalid_argument, op,
               "() before setup(): register the parameters and call setup() first");
}

void Engine::Impl::fill_init(const LayerLayout& L, std::size_t begin, std::size_t count, float* out) const {
  std::size_t pos = begin;
  const std::size_t end = begin + count;
  for (int pi : L.params) {
    const auto& p = layout->params()[pi];
    const std::size_t lo = std::max(pos, p.offset), hi = std::min(end, p.offset + p.numel);
    if (lo < hi) init_values(p, options.seed, lo - p.offset, hi - lo, out + (lo - begin));
  }
  // Padding past the layer's last parameter is zero.
  if (end > L.numel) {
    const std::size_t z0 = std::max(begin, L.numel);
    std::fill(out + (z0 - begin), out + count, 0.0f);
  }
}

std::vector<TensorView> Engine::Impl::views(int li, void* base, DType t) const {
  std::vector<TensorView> out;
  const auto& L = layout->layers()[li];
  for (int pi : L.params) {
    const auto& p = layout->params()[pi];
    out.push_back({static_cast<char*>(base) + p.offset * dtype_size(t), t, p.shape, p.numel, &p.name});
  }
  return out;
}

Engine::Engine(const EngineOptions& options) {
  STRATA_CHECK(options.device != nullptr, Errc::invalid_argument, "EngineOptions.device is required");
  impl_ = std::make_unique<Impl>(options);
}

Engine::~Engine() {
  if (!impl_ || !impl_->setup_done()) return;
  auto& I = *impl_;
  // Every stream drains before what its work touches (stores, buffers) goes away, whatever
  // another one failed with.
  I.settle({I.gather_stream.get(), I.io_stream.get(), I.reduce_stream.get(), I.xfer_stream.get(), I.dev_stream.get()},
           "engine shutdown");
  if (!I.ledger) return;  // setup() failed before allocating anything
  try {
    I.drain_io();  // already drained above: this frees write-back staging a failure skipped
  } catch (const std::exception&) {
  }
  I.drop_param_store(I.store);
  I.swapper.reset();
  if (I.swap_buffer_bytes) I.ledger->discharge(Tier::host, Kind::buffers, I.swap_buffer_bytes);
  if (I.swap_file_bytes) I.ledger->discharge(Tier::nvme, Kind::optimizer, I.swap_file_bytes);
  for (auto& s : I.layers) {
    for (void* p :
         {s.params_full, s.params_shard, static_cast<void*>(s.acc), static_cast<void*>(s.master),
          static_cast<void*>(s.m), static_cast<void*>(s.v), s.grad_buf, s.staging, s.copy_stage, s.device_copy}) {
      I.ledger->free(p);
    }
  }
  I.ledger->free(I.scratch);
  I.ledger->free(I.scratch_shard);
  I.ledger->free(I.dscratch);
  I.ledger->free(I.dscratch_shard);
  I.ledger->free(I.grad_stage);
}

int Engine::register_param(const std::string& name, std::vector<std::int64_t> shape, int layer, ParamInit init) {
  STRATA_CHECK(!impl_->setup_done(), Errc::invalid_argument, "register_param('", name, "') after setup()");
  ParamSpec p;
  p.name = name;
  p.shape = std::move(shape);
  p.layer = layer;
  p.init = init;
  impl_->pending.push_back(std::move(p));
  return static_cast<int>(impl_->pending.size()) - 1;
}

void Engine::begin_step() {
  auto& I = *impl_;
  I.require_setup("begin_step");
  STRATA_CHECK(!I.in_step, Errc::invalid_argument, "begin_step() twice without step()");
  STRATA_CHECK(!I.in_eval, Errc::invalid_argument, "begin_step() inside begin_eval()/end_eval()");
  I.in_step = true;
  I.io = {};
  I.step_start = std::chrono::steady_clock::now();
  std::erase_if(I.writebacks, [](const Engine::Impl::Writeback& w) { return w.freed->load(); });
  for (auto& S : I.layers) S.reductions = 0;
  I.cursor = 0;
  I.diverged = false;
  I.recording.clear();
}

void Engine::begin_eval() {
  auto& I = *impl_;
  I.require_setup("begin_eval");
  STRATA_CHECK(!I.in_step && !I.in_eval, Errc::invalid_argument, "begin_eval() inside a step or another evaluation");
  I.in_eval = true;
}

void Engine::end_eval() {
  auto& I = *impl_;
  STRATA_CHECK(I.in_eval, Errc::invalid_argument, "end_eval() without begin_eval()");
  for (const auto& S : I.layers) {
    STRATA_CHECK(S.in_use == 0, Errc::invalid_argument,
                 "end_eval() with a layer still gathered: release every gather first");
  }
  I.in_eval = false;
}

std::vector<TensorView> Engine::gather(int layer) {
  impl_->require_setup("gather");
  return impl_->gather(impl_->layout->layer_index(layer));
}
void Engine::release(int layer) {
  impl_->require_setup("release");
  impl_->release(impl_->layout->layer_index(layer));
}
std::vector<TensorView> Engine::grad_buffers(int layer) {
  impl_->require_setup("grad_buffers");
  return impl_->grad_buffers(impl_->layout->layer_index(layer));
}
void Engine::reduce_grads(int layer) {
  impl_->require_setup("reduce_grads");
  impl_->reduce_grads(impl_->layout->layer_index(layer));
}

float Engine::loss_scale() const noexcept { return static_cast<float>(impl_->scaler.scale()); }
DType Engine::compute_dtype() const noexcept { return impl_->cdt; }
int Engine::rank() const noexcept { return impl_->rank; }
int Engine::world_size() const noexcept { return impl_->world; }
const EngineConfig& Engine::config() const noexcept { return impl_->cfg; }
device::Device& Engine::device() const noexcept { return impl_->dev; }
const Layout& Engine::layout() const {
  impl_->require_setup("layout");
  return *impl_->layout;
}

std::vector<int> Engine::layer_ids() const {
  std::vector<int> ids;
  for (const auto& L : layout().layers()) ids.push_back(L.id);
  return ids;
}

MemoryReport Engine::memory() const {
  MemoryReport r;
  if (!impl_->setup_done()) return r;
  r.device = impl_->ledger->usage(Tier::device);
  r.host = impl_->ledger->usage(Tier::host);
  r.nvme = impl_->ledger->usage(Tier::nvme);
  r.live_gathered_elems = impl_->live_elems;
  r.peak_gathered_elems = impl_->peak_live_elems;
  return r;
}

IoStats Engine::io_stats() const { return impl_->last_io; }

void Engine::synchronize() {
  auto& I = *impl_;
  if (!I.setup_done()) return;
  for (auto* st : {I.gather_stream.get(), I.reduce_stream.get(), I.xfer_stream.get(), I.dev_stream.get()}) {
    if (st != nullptr) st->synchronize();
  }
  I.drain_io();
}

std::string Engine::explain_placement() const {
  impl_->require_setup("explain_placement");
  return impl_->placement_text;
}

std::vector<float> Engine::full_parameters() {
  auto& I = *impl_;
  I.require_setup("full_parameters");
  const Layout& lay = *I.layout;
  std::vector<std::vector<float>> per_layer(lay.layers().size());
  for (std::size_t li = 0; li < lay.layers().size(); ++li) {
    const auto& L = lay.layers()[li];
    const auto& S = I.layers[li];
    auto& full = per_layer[li];
    full.resize(L.padded);
    if (I.cfg.zero.stage == 0) {
      I.copy_bytes(full.data(), Tier::host, S.master, S.opt_tier, L.padded * 4);
      I.dev_stream->synchronize();
      continue;
    }
    std::vector<float> copied;
    const float* master = S.master;
    if (S.opt_tier != Tier::host) {
      copied.resize(S.shard_total);
      if (S.opt_tier == Tier::nvme)
        I.read_master_shard(static_cast<int>(li), copied.data());
      else
        I.copy_bytes(copied.data(), Tier::host, S.master, Tier::device, S.shard_total * 4);
      I.dev_stream->synchronize();
      master = copied.data();
    }
    for (std::size_t k = 0; k < L.buckets.size(); ++k) {
      const auto& b = lay.buckets()[L.buckets[k]];
      float* dst = full.data() + I.bucket_pos(b, L);
      if (I.world > 1)
        I.comm->all_gather(master + S.shard_off[k], dst, b.shard, DType::fp32);
      else
        std::memcpy(dst, master + S.shard_off[k], b.shard * 4);
    }
  }
  std::vector<float> out;
  out.reserve(lay.total_numel());
  for (const auto& p : lay.params()) {
    const int li = lay.layer_index(p.layer);
    const float* src = per_layer[li].data() + p.offset;
    out.insert(out.end(), src, src + p.numel);
  }
  return out;
}

StepResult train_step(Engine& engine, const std::vector<Layer*>& layers, const std::vector<int>& layer_ids) {
  STRATA_CHECK(layers.size() == layer_ids.size(), Errc::invalid_argument, "train_step: ", layers.size(), " layers but ",
               layer_ids.size(), " layer ids");
  const auto accum = std::max<std::int64_t>(1, engine.config().gradient_accumulation_steps);
  engine.begin_step();
  for (int mb = 0; mb < accum; ++mb) {
    for (std::size_t i = 0; i < layers.size(); ++i) {
      const auto params = engine.gather(layer_ids[i]);
      layers[i]->forward(mb, params);
      engine.release(layer_ids[i]);
    }
    for (std::size_t i = layers.size(); i-- > 0;) {
      const auto params = engine.gather(layer_ids[i]);
      const auto grads = engine.grad_buffers(layer_ids[i]);
      layers[i]->backward(mb, params, grads, engine.loss_scale());
      engine.reduce_grads(layer_ids[i]);
      engine.release(layer_ids[i]);
    }
  }
  return engine.step();
}

}  // namespace strata::engine
