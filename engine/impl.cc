// Engine::Impl's construction (the config checks that need no layout) and the helpers every
// phase of the engine shares: stream settling, the deterministic initial values, the views
// handed to the trainer, step()'s protocol check, the placement's check against the first
// trace, a layer's whole values, and the walk over the parts' device memory.
#include <cstring>

#include "engine/detail/engine_impl.h"
#include "engine/engine.h"
#include "runtime/comm/communicator.h"
#include "runtime/core/error.h"
#include "runtime/core/log.h"
#include "runtime/core/units.h"

namespace strata::engine {

optim::LossScalerConfig Engine::Impl::scaler_config() const {
  const EngineConfig& c = cfg;
  if (!c.fp16.enabled) {
    optim::LossScalerConfig s;
    s.dynamic = false;
    s.static_scale = 1.0;
    return s;
  }
  return optim::loss_scaler_config_from_deepspeed(c.fp16.loss_scale, c.fp16.initial_scale_power,
                                                  c.fp16.loss_scale_window, c.fp16.hysteresis, c.fp16.min_loss_scale);
}

Engine::Impl::Impl(const EngineOptions& o) : options(o), dev(*o.device), ranks{.comm = o.comm, .dcomm = o.device_comm} {
  if (ranks.comm != nullptr) {
    ranks.rank = ranks.comm->rank();
    ranks.world = ranks.comm->world_size();
  }
  STRATA_CHECK(ranks.dcomm == nullptr || (ranks.comm != nullptr && ranks.dcomm->rank() == ranks.rank &&
                                          ranks.dcomm->world_size() == ranks.world),
               Errc::invalid_argument, "EngineOptions.device_comm (rank ", ranks.dcomm ? ranks.dcomm->rank() : -1,
               " of ", ranks.dcomm ? ranks.dcomm->world_size() : 0,
               ") must join the same ranks as EngineOptions.comm (rank ", ranks.rank, " of ", ranks.world, ")");
  (void)initial_loss_scale();  // a bad fp16 block fails here
  STRATA_CHECK(cfg.zero.stage >= 0 && cfg.zero.stage <= 3, Errc::invalid_argument,
               "zero_optimization.stage = ", cfg.zero.stage, ": use 0, 1, 2 or 3");
  STRATA_CHECK(cfg.offload_param.device == OffloadDevice::none || cfg.zero.stage == 3, Errc::invalid_argument,
               "offload_param.device needs zero_optimization.stage 3 (only stage 3 partitions parameters); stage is ",
               cfg.zero.stage);
  STRATA_CHECK(cfg.offload_optimizer.device != OffloadDevice::nvme || cfg.zero.stage >= 1, Errc::invalid_argument,
               "offload_optimizer.device = \"nvme\" needs zero_optimization.stage 1, 2 or 3; stage is ",
               cfg.zero.stage);
  STRATA_CHECK(cfg.optimizer.type != OptimizerType::lamb || cfg.zero.stage == 0, Errc::invalid_argument,
               "optimizer.type = \"Lamb\" needs zero_optimization.stage 0 (stage is ", cfg.zero.stage,
               "): LAMB scales each tensor's update by a ratio of whole-tensor norms, and ZeRO stages 1-3 split "
               "tensors across ranks (DeepSpeed refuses it there too, as an untested ZeRO optimizer)");
  const MomentFormat mf = cfg.optimizer.moment_format;
  STRATA_CHECK(mf == MomentFormat::fp32 || cfg.optimizer.type != OptimizerType::muon, Errc::invalid_argument,
               moment_format_name(mf),
               " moments with optimizer Muon: Strata's Muon keeps an fp32 momentum; use fp32 moments, or AdamW");
  STRATA_CHECK(mf == MomentFormat::fp32 || mf == MomentFormat::bf16 || mf == MomentFormat::q8, Errc::invalid_argument,
               "optimizer moments in format ", static_cast<int>(mf), ": Strata keeps them in fp32, bf16 or q8");
  STRATA_CHECK(mf == MomentFormat::fp32 || cfg.optimizer.type != OptimizerType::lamb, Errc::invalid_argument,
               moment_format_name(mf),
               " moments with optimizer Lamb: Strata's Lamb keeps fp32 moments; use AdamW, Lion or Adagrad, or fp32 "
               "moments");
  STRATA_CHECK(
      mf != MomentFormat::q8 || cfg.optimizer.type == OptimizerType::adam || cfg.optimizer.type == OptimizerType::adamw,
      Errc::invalid_argument, "q8 moments with optimizer ", optimizer_type_name(cfg.optimizer.type),
      ": q8 moments are for Adam and AdamW; use bf16 (or fp32) moments with this optimizer");
  STRATA_CHECK(cfg.optimizer.type != OptimizerType::lamb || dev.backend() == device::Backend::host, Errc::unsupported,
               "optimizer.type = \"Lamb\" has no CUDA kernel yet ('", dev.name(),
               "'): use Adam/AdamW on a GPU, or --device host");
  STRATA_CHECK(cfg.optimizer.type != OptimizerType::muon || dev.backend() == device::Backend::host, Errc::unsupported,
               "optimizer.type = \"Muon\" has no CUDA kernel yet ('", dev.name(),
               "'): use Adam/AdamW on a GPU, or --device host");
  // Collectives on device memory need a communicator that reaches it (NCCL): Gloo's work
  // on host memory only.
  STRATA_CHECK(dev.backend() == device::Backend::host || ranks.world == 1 || ranks.dcomm != nullptr,
               Errc::invalid_argument, "rank ", ranks.rank, ": the ZeRO engine on a CUDA device ('", dev.name(),
               "') with ", ranks.world,
               " ranks needs EngineOptions.device_comm, a communicator on device memory (NCCL; `strata launch -- "
               "strata train --device cuda` creates one)");
  STRATA_CHECK(
      dev.backend() == device::Backend::host || ranks.dcomm == nullptr || ranks.dcomm->backend() == comm::Backend::nccl,
      Errc::invalid_argument, "rank ", ranks.rank,
      ": EngineOptions.device_comm is a gloo communicator, which "
      "cannot reach the memory of a CUDA device ('",
      dev.name(), "'): use an NCCL communicator");
}

void Engine::Impl::drain_io() {
  if (nvme) nvme->drain();
}

void Engine::Impl::finish_tail() {
  if (!step.overlap) return;
  if (flags.in_step) {
    step.overlap->finish_tail();
    return;
  }
  traffic.io = {};  // between steps nothing reads it (begin_step() resets it): it collects the tail's traffic
  step.overlap->finish_tail();
  traffic.last += traffic.io;
}

void Engine::Impl::settle(std::initializer_list<device::Stream*> streams, const char* when) noexcept {
  auto quietly = [&](auto&& sync) {
    try {
      sync();
    } catch (const std::exception& e) {
      if (*when != '\0') STRATA_LOG(warn, "rank ", ranks.rank, ": ", when, ": ", e.what());
    }
  };
  for (auto* st : streams) {
    if (st != nullptr) quietly([st] { st->synchronize(); });
  }
  if (nvme) quietly([this] { nvme->drain(); });
}

void Engine::Impl::require_setup(const char* op) const {
  STRATA_CHECK(setup_done(), Errc::invalid_argument, op,
               "() before setup(): register the parameters and call setup() first");
}

void Engine::Impl::require_complete_setup(const char* op) const {
  require_setup(op);
  STRATA_CHECK(flags.setup_complete, Errc::invalid_argument, op,
               "(): setup() failed on this engine, so it cannot train: fix what it reported and create a new Engine");
  STRATA_CHECK(!offloaded, Errc::invalid_argument, op,
               "(): the engine's states are offloaded to host RAM (offload_states()): call reload_states() first");
}

void Engine::Impl::write_pending_values() {
  if (flags.first_values_pending) write_first_values();
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

void Engine::Impl::check_step_ready() const {
  const auto accum = cfg.gradient_accumulation_steps > 0 ? cfg.gradient_accumulation_steps : 1;
  for (std::size_t li = 0; li < layer_count(); ++li) {
    const int id = layout->layers()[li].id;
    const auto reductions = frozen(static_cast<int>(li)) ? accum : grads->reductions(static_cast<int>(li));
    STRATA_CHECK(reductions == accum, Errc::invalid_argument, "step(): layer ", id, " reduced its gradients ",
                 reductions, " times this step; gradient_accumulation_steps is ", accum,
                 ": call reduce_grads once per layer per micro-batch");
    STRATA_CHECK(!gather_path || gather_path->in_use(static_cast<int>(li)) == 0, Errc::invalid_argument,
                 "step(): layer ", id, " is still gathered: release() every gather() before step()");
  }
}

// The first recorded trace: the budget-driven plan is checked against it (placement_plan.h).
void Engine::Impl::replan_on_first_trace() {
  if (!gather_path || !gather_path->end_step(step_calls() + 1)) return;
  std::vector<int> gathers(layer_count(), 0);
  for (int li : gather_path->trace().trace()) ++gathers[static_cast<std::size_t>(li)];
  plan->replan(gathers, step_calls() + 1, [this](const std::vector<Tier>& to) {
    gather_path->synchronize();
    return homes->migrate(to);
  });
}

// The whole padded layer li's fp32 values on every rank: its masters (a frozen layer: its
// compute copies, widened), this rank's part read where it lives and the rest all-gathered.
std::vector<float> Engine::Impl::layer_values(std::size_t li) {
  const Layout& lay = *layout;
  const auto& L = lay.layers()[li];
  std::vector<float> full(L.padded);
  const auto read_own = [&](float* out) {
    if (L.frozen)
      homes->read_own(static_cast<int>(li), out);
    else
      opt_state->read(static_cast<int>(li), out, nullptr, nullptr);
  };
  if (cfg.zero.stage == 0) {
    read_own(full.data());
    return full;
  }
  std::vector<float> copied;
  const float* master = opt_state->resident(static_cast<int>(li)).master;
  if (L.frozen || plan->shards().opt_tier(static_cast<int>(li)) != Tier::host) {
    copied.resize(L.shard);
    read_own(copied.data());
    master = copied.data();
  }
  for (std::size_t k = 0; k < L.buckets.size(); ++k) {
    const auto& b = lay.buckets()[L.buckets[k]];
    float* dst = full.data() + bucket_pos(b, L);
    if (ranks.world > 1)
      ranks.comm->all_gather(master + L.shard_offsets[k], dst, b.shard, DType::fp32);
    else
      std::memcpy(dst, master + L.shard_offsets[k], b.shard * 4);
  }
  return full;
}

void Engine::Impl::walk_device_memory(const DeviceSwap::Fn& fn) {
  homes->device_memory(fn);
  opt_state->device_memory(fn);
  grads->device_memory(fn);
}

}  // namespace strata::engine
