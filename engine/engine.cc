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

void Engine::setup() {
  auto& I = *impl_;
  STRATA_CHECK(!I.setup_done(), Errc::invalid_argument, "setup() called twice");
  const int stage = I.cfg.zero.stage;
  I.layout = std::make_unique<Layout>(std::move(I.pending), I.world, I.cfg.zero.reduce_bucket_size);
  const Layout& lay = *I.layout;

  // Every rank must have registered the same model: compare fingerprints.
  if (I.comm != nullptr && I.world > 1) {
    std::uint64_t mine = lay.fingerprint();
    std::vector<std::uint64_t> all(I.world);
    I.comm->all_gather(&mine, all.data(), 2, DType::fp32);  // 8 bytes carried as two fp32 words
    for (int r = 0; r < I.world; ++r) {
      STRATA_CHECK(
          all[r] == all[0], Errc::invalid_argument, "rank ", I.rank,
          ": the registered parameters differ between ranks (rank ", r,
          " registered a different model than "
          "rank 0: names, shapes, layers or init). Every rank must register the same parameters in the same order");
    }
  }

  I.ledger = std::make_unique<MemoryLedger>(
      I.dev, I.cfg.memory_budget.host ? I.cfg.memory_budget.host : ~std::uint64_t{0} / 2,
      I.cfg.offload_optimizer.pin_memory || I.cfg.offload_param.pin_memory, I.cfg.memory_budget.nvme);
  I.dev_stream = I.dev.create_stream();
  I.layers.resize(lay.layers().size());
  for (std::size_t li = 0; li < lay.layers().size(); ++li) {
    auto& S = I.layers[li];
    for (int bi : lay.layers()[li].buckets) {
      S.shard_off.push_back(S.shard_total);
      S.shard_total += lay.buckets()[bi].shard;
    }
    S.persistent = stage == 3 && lay.layers()[li].numel < I.cfg.zero.stage3_param_persistence_threshold;
  }
  // Where every layer's state lives, checked against the device budget (less what the
  // trainer already holds there) before anything is allocated (engine_place.cc).
  I.device_held_by_others = I.dev.memory_stats().used_bytes;
  I.place_layers();
  const auto& oc = I.cfg.optimizer;
  if (I.dev.backend() == device::Backend::cuda && oc.type != OptimizerType::adam && oc.type != OptimizerType::adamw) {
    for (std::size_t li = 0; li < I.layers.size(); ++li) {
      STRATA_CHECK(I.layers[li].opt_tier != Tier::device, Errc::unsupported, "optimizer.type ",
                   oc.type == OptimizerType::lion ? "Lion" : "Adagrad", " has no CUDA kernel yet, and layer ",
                   lay.layers()[li].id,
                   "'s optimizer state is placed on the GPU: use Adam/AdamW, or run it on the "
                   "CPU with offload_optimizer.device = \"cpu\"");
    }
  }

  std::size_t max_bucket = 0, max_shard = 0;
  for (const auto& b : lay.buckets()) {
    max_bucket = std::max(max_bucket, b.padded);
    max_shard = std::max(max_shard, b.shard);
  }
  I.scratch = static_cast<float*>(I.ledger->allocate(Tier::host, Kind::buffers, max_bucket * 4, "reduction scratch"));
  I.scratch_shard =
      static_cast<float*>(I.ledger->allocate(Tier::host, Kind::buffers, max_shard * 4, "reduction shard"));
  if (I.device_collectives()) {
    I.dscratch = static_cast<float*>(
        I.ledger->allocate(Tier::device, Kind::buffers, max_bucket * 4, "device reduction scratch"));
    I.dscratch_shard =
        static_cast<float*>(I.ledger->allocate(Tier::device, Kind::buffers, max_shard * 4, "device reduction shard"));
  }
  bool any_acc_on_host = false, any_opt_nvme = false, any_param_nvme = false;
  for (std::size_t li = 0; li < I.layers.size(); ++li) {
    any_acc_on_host |= I.acc_on_host(static_cast<int>(li));
    any_opt_nvme |= I.layers[li].opt_tier == Tier::nvme;
    any_param_nvme |= I.layers[li].param_tier == Tier::nvme;
  }
  if (any_acc_on_host) {
    I.grad_stage =
        I.ledger->allocate(Tier::host, Kind::buffers, max_bucket * I.cbytes, "gradient staging (device -> host)");
  }
  if (any_acc_on_host) I.xfer_stream = I.dev.create_stream();
  if (any_opt_nvme) I.setup_swapper();
  if (any_param_nvme) {
    I.setup_param_store();
    I.io_stream = I.dev.create_stream();
  }

  std::vector<float> init, master_shard;
  std::vector<char> shard_bytes, full_bytes;
  for (std::size_t li = 0; li < lay.layers().size(); ++li) {
    const auto& L = lay.layers()[li];
    auto& S = I.layers[li];
    const std::string name = str_cat("layer ", L.id);
    const std::size_t opt_elems = stage == 0 ? L.padded : S.shard_total;
    const bool opt_nvme = S.opt_tier == Tier::nvme;
    if (!opt_nvme) {
      S.master = static_cast<float*>(I.ledger->allocate(S.opt_tier, Kind::optimizer, opt_elems * 4, name + " master"));
      S.m = static_cast<float*>(I.ledger->allocate(S.opt_tier, Kind::optimizer, opt_elems * 4, name + " exp_avg"));
      S.v = static_cast<float*>(I.ledger->allocate(S.opt_tier, Kind::optimizer, opt_elems * 4, name + " exp_avg_sq"));
      I.fill_zero(S.m, opt_elems * 4, S.opt_tier);
      I.fill_zero(S.v, opt_elems * 4, S.opt_tier);
    }
    const std::size_t acc_elems = stage <= 1 ? L.padded : S.shard_total;
    const Tier acc_tier = I.acc_on_host(static_cast<int>(li)) ? Tier::host : Tier::device;
    S.acc = static_cast<float*>(I.ledger->allocate(acc_tier, Kind::grads, acc_elems * 4, name + " gradients"));
    I.fill_zero(S.acc, acc_elems * 4, acc_tier);

    // Master weights: the whole layer (stage 0) or this rank's shard of every bucket, built
    // in host memory and copied to their tier.
    init.resize(L.padded);
    I.fill_init(L, 0, L.padded, init.data());
    if (stage == 0) {
      I.copy_bytes(S.master, S.opt_tier, init.data(), Tier::host, L.padded * 4);
    } else {
      master_shard.resize(S.shard_total);
      for (std::size_t k = 0; k < L.buckets.size(); ++k) {
        const auto& b = lay.buckets()[L.buckets[k]];
        std::memcpy(master_shard.data() + S.shard_off[k], init.data() + I.bucket_pos(b, L) + I.own_begin(b),
                    b.shard * 4);
      }
      if (opt_nvme)
        I.swapper->initialize(static_cast<std::size_t>(S.swap_index), master_shard.data());
      else
        I.copy_bytes(S.master, S.opt_tier, master_shard.data(), Tier::host, S.shard_total * 4);
    }
    if (stage <= 2 || S.persistent) {
      S.params_full = I.ledger->allocate(Tier::device, Kind::params, L.padded * I.cbytes, name + " parameters");
      full_bytes.resize(L.padded * I.cbytes);
      convert(init.data(), DType::fp32, full_bytes.data(), I.cdt, L.padded);
      I.copy_bytes(S.params_full, Tier::device, full_bytes.data(), Tier::host, full_bytes.size());
    }
    if (stage == 3) {
      shard_bytes.resize(S.shard_total * I.cbytes);
      for (std::size_t k = 0; k < L.buckets.size(); ++k) {
        const auto& b = lay.buckets()[L.buckets[k]];
        convert(init.data() + I.bucket_pos(b, L) + I.own_begin(b), DType::fp32,
                shard_bytes.data() + S.shard_off[k] * I.cbytes, I.cdt, b.shard);
      }
      if (S.param_tier == Tier::nvme) {
        I.param_store->write(static_cast<std::size_t>(S.store_index), shard_bytes.data());
      } else {
        S.params_shard =
            I.ledger->allocate(S.param_tier, Kind::params, S.shard_total * I.cbytes, name + " parameter shards");
        I.copy_bytes(S.params_shard, S.param_tier, shard_bytes.data(), Tier::host, shard_bytes.size());
      }
    }
    I.dev_stream->synchronize();  // the host buffers above are reused for the next layer
  }
  if (I.param_store) I.param_store->commit();
  if (stage == 3) I.gather_stream = I.dev.create_stream();
  if (I.cfg.zero.overlap_comm) I.reduce_stream = I.dev.create_stream();
  STRATA_LOG(debug, "rank ", I.rank, ": ZeRO stage ", stage, ", ", lay.total_numel(), " parameters (",
             lay.total_padded(), " padded) in ", lay.layers().size(), " layers, ", lay.buckets().size(), " buckets");
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

StepResult Engine::step() {
  auto& I = *impl_;
  I.require_setup("step");
  STRATA_CHECK(I.in_step, Errc::invalid_argument, "step() without begin_step()");
  const auto accum = I.cfg.gradient_accumulation_steps > 0 ? I.cfg.gradient_accumulation_steps : 1;
  const Layout& lay = *I.layout;
  const int stage = I.cfg.zero.stage;
  for (std::size_t li = 0; li < I.layers.size(); ++li) {
    STRATA_CHECK(I.layers[li].reductions == accum, Errc::invalid_argument, "step(): layer ", lay.layers()[li].id,
                 " reduced its gradients ", I.layers[li].reductions,
                 " times this step; gradient_accumulation_steps is ", accum,
                 ": call reduce_grads once per layer per micro-batch");
    STRATA_CHECK(I.layers[li].in_use == 0, Errc::invalid_argument, "step(): layer ", lay.layers()[li].id,
                 " is still gathered: release() every gather() before step()");
  }
  if (I.reduce_stream) I.reduce_stream->synchronize();  // every reduction of the step is in
  I.dev_stream->synchronize();
  Tracer::Span span(I.options.tracer, "optimizer", "step");
  I.end_step_trace();
  ++I.step_calls;

  // 1. This rank's share of the squared norm: its shard of every bucket, in bucket order.
  optim::GradNorm local;
  for (std::size_t li = 0; li < I.layers.size(); ++li) {
    const auto& L = lay.layers()[li];
    const auto& S = I.layers[li];
    for (std::size_t k = 0; k < L.buckets.size(); ++k) {
      const auto& b = lay.buckets()[L.buckets[k]];
      const float* g = stage <= 1 ? S.acc + I.bucket_pos(b, L) + I.own_begin(b) : S.acc + S.shard_off[k];
      local += I.acc_on_host(static_cast<int>(li)) ? optim::grad_norm_sq(g, DType::fp32, b.shard)
                                                   : optim::grad_norm_sq(I.dev, *I.dev_stream, g, DType::fp32, b.shard);
    }
  }
  // 2. Combined in rank order on every rank, so every stage and rank sees the same bits.
  optim::GradNorm global = local;
  if (I.comm != nullptr && I.world > 1) {
    double mine[2] = {local.sumsq, local.finite ? 1.0 : 0.0};
    std::vector<double> all(2 * I.world);
    I.comm->all_gather(mine, all.data(), 4, DType::fp32);  // 16 bytes as four fp32 words
    global = {};
    for (int r = 0; r < I.world; ++r) global += optim::GradNorm{all[2 * r], all[2 * r + 1] != 0.0};
  }
  // Gradients carry loss_scale and are summed over ranks and micro-batches: average them.
  const double avg = static_cast<double>(I.world) * static_cast<double>(accum);
  global.sumsq /= avg * avg;
  const optim::StepPlan plan = optim::plan_step(global, I.scaler, I.cfg.gradient_clipping);
  StepResult result;
  result.skipped = plan.skip;
  result.grad_norm = plan.grad_norm;
  result.loss_scale = plan.loss_scale;
  result.clip_coef = plan.clip_coef;

  if (!plan.skip) {
    ++I.steps_taken;
    const float lr = scheduled_lr(I.cfg, I.steps_taken);
    result.lr = lr;
    optim::StepArgs a;
    a.grad_dtype = DType::fp32;
    a.state_dtype = DType::fp32;
    a.copy_dtype = I.cdt;
    a.grad_scale = static_cast<float>(plan.grad_scale / avg);
    a.step = I.steps_taken;
    const auto& oc = I.cfg.optimizer;
    // The optimizer on elements [e0, e0 + n) of bucket k's range in layer li (the whole
    // bucket at stage 0, this rank's shard of it above), with master/m/v wherever they live.
    auto update = [&](std::size_t li, std::size_t k, std::size_t e0, std::size_t n, float* master, float* m, float* v) {
      const auto& L = lay.layers()[li];
      auto& S = I.layers[li];
      const auto& b = lay.buckets()[L.buckets[k]];
      const std::size_t pos = I.bucket_pos(b, L);
      a.n = n;
      a.master = master;
      a.m = m;
      a.v = v;
      a.grad = (stage <= 1 ? S.acc + pos + (stage == 0 ? 0 : I.own_begin(b)) : S.acc + S.shard_off[k]) + e0;
      // Updated compute copies go where the parameters live, or through the host staging
      // (engine_nvme.cc) that carries them there once the whole layer is updated. The device
      // optimizer of a stage-3 layer whose shards live off the device writes them to a device
      // buffer first (flush_device_copy).
      const bool on_device = S.opt_tier == Tier::device;
      void* staged = nullptr;
      void* copy_base = nullptr;
      std::size_t copy_off = 0;
      if (on_device && stage == 3 && S.param_tier != Tier::device) {
        if (S.device_copy == nullptr) {
          S.device_copy = I.ledger->allocate(Tier::device, Kind::buffers, S.shard_total * I.cbytes,
                                             str_cat("layer ", L.id, " updated parameters (device)"));
        }
        copy_base = S.device_copy;
        copy_off = S.shard_off[k] + e0;
      } else {
        staged = I.copy_target(static_cast<int>(li));
        copy_base = staged != nullptr ? staged : stage == 3 ? S.params_shard : S.params_full;
        copy_off = (staged != nullptr ? I.copy_offset(static_cast<int>(li), k)
                    : stage == 3      ? S.shard_off[k]
                                      : pos + (stage == 0 ? 0 : I.own_begin(b))) +
                   e0;
      }
      char* copy = static_cast<char*>(copy_base) + copy_off * I.cbytes;
      a.copy = I.cdt == DType::fp32 ? nullptr : copy;  // an fp32 compute copy is the master's bits
      const optim::AdamConfig adam{
          lr, oc.beta1, oc.beta2, oc.eps, oc.weight_decay, oc.type == OptimizerType::adamw, oc.bias_correction};
      const optim::LionConfig lion{lr, oc.beta1, oc.beta2, oc.weight_decay};
      const optim::AdagradConfig adagrad{lr, 0.0f, oc.eps, oc.weight_decay};
      if (on_device) {
        // On the device's stream: the CUDA kernels, or the same CPU kernels on the host
        // backend's worker (Lion and Adagrad have no CUDA kernel: setup() refuses them there).
        switch (oc.type) {
          case OptimizerType::adam:
          case OptimizerType::adamw:
            optim::adam_step_async(*I.dev_stream, adam, a);
            break;
          case OptimizerType::lion:
            I.dev_stream->launch_host([lion, a] { optim::lion_step(lion, a); });
            break;
          case OptimizerType::adagrad:
            I.dev_stream->launch_host([adagrad, a] { optim::adagrad_step(adagrad, a); });
            break;
        }
        if (I.cdt == DType::fp32) I.copy_bytes(copy, Tier::device, a.master, Tier::device, n * 4);
      } else {
        switch (oc.type) {
          case OptimizerType::adam:
          case OptimizerType::adamw:
            optim::adam_step(adam, a);
            break;
          case OptimizerType::lion:
            optim::lion_step(lion, a);
            break;
          case OptimizerType::adagrad:
            optim::adagrad_step(adagrad, a);
            break;
        }
        if (I.cdt == DType::fp32) std::memcpy(copy, a.master, n * 4);  // host: staging or host shards
      }
      if (staged != nullptr) I.copy_updated(static_cast<int>(li), n);
    };
    // Stages 1-2: every rank refreshes its replica of the bucket from the owners.
    auto regather = [&](std::size_t li, std::size_t k) {
      if ((stage != 1 && stage != 2) || I.world == 1) return;
      const auto& L = lay.layers()[li];
      const auto& b = lay.buckets()[L.buckets[k]];
      char* full = static_cast<char*>(I.layers[li].params_full) + I.bucket_pos(b, L) * I.cbytes;
      if (I.device_collectives())
        I.dcomm->all_gather(full + I.own_begin(b) * I.cbytes, full, b.shard, I.cdt, *I.dev_stream);
      else
        I.comm->all_gather(full + I.own_begin(b) * I.cbytes, full, b.shard, I.cdt);
    };
    try {
      if (I.swapper) {
        // Sub-groups come in layer then offset order; a sub-group may cover parts of several
        // buckets and a bucket may span sub-groups: the optimizer is elementwise, so the bits
        // do not depend on where the state is cut.
        I.swapper->step([&](const offload::SubGroup& g) {
          const std::size_t li = static_cast<std::size_t>(I.swap_layers[g.tensor]);
          const auto& L = lay.layers()[li];
          const auto& S = I.layers[li];
          for (std::size_t k = 0; k < L.buckets.size(); ++k) {
            const std::size_t b0 = S.shard_off[k], b1 = b0 + lay.buckets()[L.buckets[k]].shard;
            const std::size_t lo = std::max<std::size_t>(b0, g.offset),
                              hi = std::min<std::size_t>(b1, g.offset + g.elems);
            if (lo >= hi) continue;
            const std::size_t at = lo - g.offset;
            update(li, k, lo - b0, hi - lo, g.master + at, g.exp_avg + at, g.exp_avg_sq + at);
          }
        });
        const auto ss = I.swapper->stats();
        I.io.nvme_read_bytes += ss.bytes_read;
        I.io.nvme_write_bytes += ss.bytes_written;
        I.io.io_wait_seconds += ss.wait_seconds;
      }
      for (std::size_t li = 0; li < I.layers.size(); ++li) {
        const auto& L = lay.layers()[li];
        auto& S = I.layers[li];
        if (S.opt_tier == Tier::nvme) continue;
        for (std::size_t k = 0; k < L.buckets.size(); ++k) {
          const auto& b = lay.buckets()[L.buckets[k]];
          const std::size_t off = stage == 0 ? I.bucket_pos(b, L) : S.shard_off[k];
          update(li, k, 0, stage == 0 ? b.padded : b.shard, S.master + off, S.m + off, S.v + off);
        }
        I.flush_device_copy(static_cast<int>(li));
      }
      I.dev_stream->synchronize();  // the device optimizer's updates are in
      if (I.param_store) I.io_stream->launch_host([store = I.param_store.get()] { store->commit(); });
    } catch (...) {
      // Device work already queued may still write the buffers dropped below: let it finish.
      I.settle({I.dev_stream.get(), I.xfer_stream.get()}, "device work after a failed step");
      // The last good parameter shards on NVMe stay current; staged copies are dropped.
      if (I.param_store) {
        try {
          I.drain_io();  // queued write-backs finish before they are dropped
        } catch (const std::exception& e) {
          STRATA_LOG(warn, "rank ", I.rank, ": parameter write-back after a failed step: ", e.what());
        }
        I.param_store->abort();
      }
      for (auto& S : I.layers) {
        I.ledger->free(S.copy_stage);
        S.copy_stage = nullptr;
        S.copy_done = 0;
        I.ledger->free(S.device_copy);
        S.device_copy = nullptr;
      }
      I.in_step = false;
      throw;
    }
    for (std::size_t li = 0; li < I.layers.size(); ++li) {
      const auto& L = lay.layers()[li];
      auto& S = I.layers[li];
      for (std::size_t k = 0; k < L.buckets.size(); ++k) regather(li, k);
      // Stage 3 keeps small layers gathered for good: refresh them from the new shards.
      if (stage == 3 && S.persistent) {
        for (std::size_t k = 0; k < L.buckets.size(); ++k) {
          const auto& b = lay.buckets()[L.buckets[k]];
          char* full = static_cast<char*>(S.params_full) + I.bucket_pos(b, L) * I.cbytes;
          const char* mine = static_cast<char*>(S.params_shard) + S.shard_off[k] * I.cbytes;
          if (I.device_collectives()) {
            // This rank's shard into its place, then all-gathered in place on the device.
            char* own = full + I.own_begin(b) * I.cbytes;
            I.copy_bytes(own, Tier::device, mine, S.param_tier, b.shard * I.cbytes);
            I.dcomm->all_gather(own, full, b.shard, I.cdt, *I.dev_stream);
          } else if (I.world > 1) {
            I.comm->all_gather(mine, full, b.shard, I.cdt);
          } else {
            I.copy_bytes(full, Tier::device, mine, S.param_tier, b.shard * I.cbytes);
          }
        }
      }
    }
    I.dev_stream->synchronize();
  } else {
    STRATA_LOG(info, "rank ", I.rank, ": step skipped: gradient overflow at loss scale ", plan.loss_scale,
               " (next scale ", I.scaler.scale(), ")");
  }
  for (std::size_t li = 0; li < I.layers.size(); ++li) {
    const auto& L = lay.layers()[li];
    I.fill_zero(I.layers[li].acc, (stage <= 1 ? L.padded : I.layers[li].shard_total) * 4,
                I.acc_on_host(static_cast<int>(li)) ? Tier::host : Tier::device);
  }
  I.dev_stream->synchronize();
  I.in_step = false;
  result.step = I.steps_taken;
  I.io.step_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - I.step_start).count();
  I.last_io = I.io;
  return result;
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
