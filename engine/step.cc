// The optimizer step (Engine::step, the protocol in engine.h) in its phases: the checks
// that every layer was reduced and released, the global gradient norm combined in rank order,
// the step plan (overflow skip, loss scale, clipping), the optimizer on every shard wherever
// it lives (device stream, CPU, or the NVMe swapper's sub-groups), the rollback of a step
// that fails halfway, the refresh of replicated (stages 1-2) and persistent (stage 3)
// parameters, and the zeroing of the gradient accumulators.
#include <chrono>
#include <cstring>

#include "engine/detail/engine_impl.h"
#include "engine/engine.h"
#include "engine/tier_copy.h"
#include "optim/adagrad.h"
#include "optim/adam.h"
#include "optim/device_step.h"
#include "optim/grad_norm.h"
#include "optim/lamb.h"
#include "optim/lion.h"
#include "optim/step_plan.h"
#include "runtime/comm/communicator.h"
#include "runtime/core/error.h"
#include "runtime/core/log.h"
#include "runtime/core/units.h"

namespace strata::engine {

void Engine::Impl::check_step_ready() const {
  const auto accum = cfg.gradient_accumulation_steps > 0 ? cfg.gradient_accumulation_steps : 1;
  const Layout& lay = *layout;
  for (std::size_t li = 0; li < layers.size(); ++li) {
    const int reductions = grads->reductions(static_cast<int>(li));
    STRATA_CHECK(reductions == accum, Errc::invalid_argument, "step(): layer ", lay.layers()[li].id,
                 " reduced its gradients ", reductions, " times this step; gradient_accumulation_steps is ", accum,
                 ": call reduce_grads once per layer per micro-batch");
    STRATA_CHECK(!gather_path || gather_path->in_use(static_cast<int>(li)) == 0, Errc::invalid_argument,
                 "step(): layer ", lay.layers()[li].id, " is still gathered: release() every gather() before step()");
  }
}

optim::GradNorm Engine::Impl::global_grad_norm() {
  const Layout& lay = *layout;
  const int stage = cfg.zero.stage;
  // 1. This rank's share of the squared norm: its shard of every bucket, in bucket order.
  optim::GradNorm local;
  for (std::size_t li = 0; li < layers.size(); ++li) {
    const auto& L = lay.layers()[li];
    const auto& S = layers[li];
    const float* acc = grads->accumulator(static_cast<int>(li));
    for (std::size_t k = 0; k < L.buckets.size(); ++k) {
      const auto& b = lay.buckets()[L.buckets[k]];
      const float* g = stage <= 1 ? acc + bucket_pos(b, L) + own_begin(b) : acc + S.shard_off[k];
      local += acc_on_host(static_cast<int>(li)) ? optim::grad_norm_sq(g, DType::fp32, b.shard)
                                                 : optim::grad_norm_sq(dev, *dev_stream, g, DType::fp32, b.shard);
    }
  }
  // 2. Combined in rank order on every rank, so every stage and rank sees the same bits.
  optim::GradNorm global = local;
  if (comm != nullptr && world > 1) {
    double mine[2] = {local.sumsq, local.finite ? 1.0 : 0.0};
    std::vector<double> all(2 * world);
    comm->all_gather(mine, all.data(), 4, DType::fp32);  // 16 bytes as four fp32 words
    global = {};
    for (int r = 0; r < world; ++r) global += optim::GradNorm{all[2 * r], all[2 * r + 1] != 0.0};
  }
  return global;
}

void Engine::Impl::update_range(const optim::StepArgs& base, float lr, std::size_t li, std::size_t k, std::size_t e0,
                                std::size_t n, float* master, float* m, float* v) {
  const Layout& lay = *layout;
  const int stage = cfg.zero.stage;
  const auto& oc = cfg.optimizer;
  const auto& L = lay.layers()[li];
  auto& S = layers[li];
  const auto& b = lay.buckets()[L.buckets[k]];
  const std::size_t pos = bucket_pos(b, L);
  optim::StepArgs a = base;
  a.n = n;
  a.master = master;
  a.m = m;
  a.v = v;
  const float* acc = grads->accumulator(static_cast<int>(li));
  a.grad = (stage <= 1 ? acc + pos + (stage == 0 ? 0 : own_begin(b)) : acc + S.shard_off[k]) + e0;
  // Updated compute copies go where the parameters live, through host staging, or to a device
  // buffer first (update_staging.h).
  const bool on_device = plan->opt_tier(static_cast<int>(li)) == Tier::device;
  const UpdateStaging::Target target = updates->target(static_cast<int>(li), k, e0);
  char* copy = target.copy;
  a.copy = cdt == DType::fp32 ? nullptr : copy;  // an fp32 compute copy is the master's bits
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
        optim::adam_step_async(*dev_stream, adam, a);
        break;
      case OptimizerType::lion:
        dev_stream->launch_host([lion, a] { optim::lion_step(lion, a); });
        break;
      case OptimizerType::adagrad:
        dev_stream->launch_host([adagrad, a] { optim::adagrad_step(adagrad, a); });
        break;
      case OptimizerType::lamb:
        STRATA_THROW(Errc::internal, "update_range: LAMB steps whole tensors (run_lamb)");
    }
    if (cdt == DType::fp32) copy_between(*dev_stream, copy, Tier::device, a.master, Tier::device, n * 4);
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
      case OptimizerType::lamb:
        STRATA_THROW(Errc::internal, "update_range: LAMB steps whole tensors (run_lamb)");
    }
    if (cdt == DType::fp32) std::memcpy(copy, a.master, n * 4);  // host: staging or host shards
  }
  if (target.staged) updates->written(static_cast<int>(li), n);
}

// LAMB (stage 0 only, impl.cc): each tensor whole on the device stream, where its state and
// compute copies may be device memory; its trust ratio needs the whole tensor's norms.
void Engine::Impl::run_lamb(const optim::StepArgs& base, float lr) {
  const auto& oc = cfg.optimizer;
  const optim::LambConfig lamb{lr,           oc.beta1,    oc.beta2, oc.eps, oc.weight_decay, oc.bias_correction,
                               oc.max_coeff, oc.min_coeff};
  const bool fp32 = cdt == DType::fp32;
  for (std::size_t li = 0; li < layers.size(); ++li) {
    for (int pi : layout->layers()[li].params) {
      const auto& p = layout->params()[pi];
      optim::StepArgs a = base;
      a.n = p.numel;
      const auto& st = opt_state->resident(static_cast<int>(li));
      a.master = st.master + p.offset;
      a.m = st.m + p.offset;
      a.v = st.v + p.offset;
      a.grad = grads->accumulator(static_cast<int>(li)) + p.offset;
      char* copy = static_cast<char*>(homes->full(static_cast<int>(li))) + p.offset * cbytes;
      a.copy = fp32 ? nullptr : copy;
      dev_stream->launch_host([lamb, a, copy, fp32] {
        std::vector<float> update(a.n);
        optim::lamb_step(lamb, a, update.data());
        if (fp32) std::memcpy(copy, a.master, a.n * 4);  // an fp32 compute copy is the master's bits
      });
    }
  }
  dev_stream->synchronize();
}

void Engine::Impl::run_optimizer(const optim::StepArgs& base, float lr) {
  const Layout& lay = *layout;
  const int stage = cfg.zero.stage;
  if (cfg.optimizer.type == OptimizerType::lamb) {
    try {
      run_lamb(base, lr);
    } catch (...) {
      abort_step();
      throw;
    }
    return;
  }
  try {
    if (auto* swapper = nvme ? nvme->swapper() : nullptr) {
      // Sub-groups come in layer then offset order; a sub-group may cover parts of several
      // buckets and a bucket may span sub-groups: the optimizer is elementwise, so the bits
      // do not depend on where the state is cut.
      swapper->step([&](const offload::SubGroup& g) {
        const std::size_t li = static_cast<std::size_t>(nvme->swap_layer(static_cast<int>(g.tensor)));
        const auto& L = lay.layers()[li];
        const auto& S = layers[li];
        for (std::size_t k = 0; k < L.buckets.size(); ++k) {
          const std::size_t b0 = S.shard_off[k], b1 = b0 + lay.buckets()[L.buckets[k]].shard;
          const std::size_t lo = std::max<std::size_t>(b0, g.offset),
                            hi = std::min<std::size_t>(b1, g.offset + g.elems);
          if (lo >= hi) continue;
          const std::size_t at = lo - g.offset;
          update_range(base, lr, li, k, lo - b0, hi - lo, g.master + at, g.exp_avg + at, g.exp_avg_sq + at);
        }
      });
      const auto ss = swapper->stats();
      io.nvme_read_bytes += ss.bytes_read;
      io.nvme_write_bytes += ss.bytes_written;
      io.io_wait_seconds += ss.wait_seconds;
    }
    for (std::size_t li = 0; li < layers.size(); ++li) {
      const auto& L = lay.layers()[li];
      auto& S = layers[li];
      if (plan->opt_tier(static_cast<int>(li)) == Tier::nvme) continue;
      for (std::size_t k = 0; k < L.buckets.size(); ++k) {
        const auto& b = lay.buckets()[L.buckets[k]];
        const std::size_t off = stage == 0 ? bucket_pos(b, L) : S.shard_off[k];
        const auto& st = opt_state->resident(static_cast<int>(li));
        update_range(base, lr, li, k, 0, stage == 0 ? b.padded : b.shard, st.master + off, st.m + off, st.v + off);
      }
      updates->flush_device(static_cast<int>(li));
    }
    dev_stream->synchronize();  // the device optimizer's updates are in
    if (auto* store = param_store()) nvme->io()->submit([store] { store->commit(); });
  } catch (...) {
    abort_step();
    throw;
  }
}

void Engine::Impl::abort_step() noexcept {
  // Device work and parameter write-backs already queued may still read or write the
  // buffers dropped below: let them finish.
  settle({dev_stream.get()}, "device work or a parameter write-back after a failed step");
  // The last good parameter shards on NVMe stay current; staged copies are dropped.
  if (auto* store = param_store()) store->abort();
  updates->drop();
  in_step = false;
}

StepResult Engine::step() {
  auto& I = *impl_;
  I.require_setup("step");
  STRATA_CHECK(I.in_step, Errc::invalid_argument, "step() without begin_step()");
  I.check_step_ready();
  I.grads->sync();  // every reduction of the step is in
  I.dev_stream->synchronize();
  Tracer::Span span(I.options.tracer, "optimizer", "step");
  if (I.gather_path && I.gather_path->end_step(I.step_calls + 1)) {
    // The first recorded trace: the budget-driven plan is checked against it (placement_plan.h).
    std::vector<int> gathers(I.layers.size(), 0);
    for (int li : I.gather_path->trace().trace()) ++gathers[static_cast<std::size_t>(li)];
    I.plan->replan(
        gathers, I.step_calls + 1,
        [&I](const std::vector<Tier>& to) {
          I.gather_path->synchronize();
          return I.homes->migrate(to);
        },
        [&I](int li) { return I.homes->tier(li); });
  }
  ++I.step_calls;

  optim::GradNorm global = I.global_grad_norm();
  // Gradients carry loss_scale and are summed over ranks and micro-batches: average them.
  const auto accum = I.cfg.gradient_accumulation_steps > 0 ? I.cfg.gradient_accumulation_steps : 1;
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
    result.lr = scheduled_lr(I.cfg, I.steps_taken);
    optim::StepArgs a;
    a.grad_dtype = DType::fp32;
    a.state_dtype = DType::fp32;
    a.copy_dtype = I.cdt;
    a.grad_scale = static_cast<float>(plan.grad_scale / avg);
    a.step = I.steps_taken;
    I.run_optimizer(a, result.lr);
    I.homes->refresh();
  } else {
    STRATA_LOG(info, "rank ", I.rank, ": step skipped: gradient overflow at loss scale ", plan.loss_scale,
               " (next scale ", I.scaler.scale(), ")");
  }
  I.grads->zero();
  I.in_step = false;
  result.step = I.steps_taken;
  I.io.step_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - I.step_start).count();
  I.last_io = I.io;
  I.poll_save(false);  // an asynchronous checkpoint commits once every rank's writes landed
  return result;
}

}  // namespace strata::engine
