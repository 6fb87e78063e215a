// OptimizerStep (the protocol in optimizer_step.h): the global norm, the step plan and the
// optimizer on every shard wherever it lives (device stream, CPU, or the NVMe swapper's
// sub-groups), and the rollback of an update that fails halfway.
#include "engine/optimizer_step.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <exception>
#include <limits>
#include <vector>

#include "engine/tier_copy.h"
#include "optim/adagrad.h"
#include "optim/adam.h"
#include "optim/device_step.h"
#include "optim/lamb.h"
#include "optim/lion.h"
#include "optim/step_plan.h"
#include "runtime/core/error.h"
#include "runtime/core/log.h"
#include "runtime/core/trace.h"

namespace strata::engine {

OptimizerStep::OptimizerStep(const Context& ctx, const optim::LossScalerConfig& scaler) : c_(ctx), scaler_(scaler) {}

void OptimizerStep::restore(const Counters& c) {
  scaler_.restore(c.scaler);  // checks the scaler's state first: a bad one leaves the counters as they were
  taken_ = c.steps_taken;
  calls_ = c.step_calls;
}

std::size_t OptimizerStep::grad_offset(int li, std::size_t k, bool whole_bucket) const {
  const std::size_t at = GradReducer::acc_offset(c_.layout, c_.cfg.zero.stage, li, k);
  // Stages 0-1 accumulate the whole bucket: this rank's shard of it starts further in.
  if (c_.cfg.zero.stage >= 2 || whole_bucket) return at;
  return at + static_cast<std::size_t>(c_.rank) * c_.layout.buckets()[c_.layout.layers()[li].buckets[k]].shard;
}

const void* OptimizerStep::grad_at(int li, std::size_t elem) const {
  return static_cast<const char*>(c_.grads.accumulator(li)) + elem * dtype_size(c_.grads.acc_dtype(li));
}

optim::GradNorm OptimizerStep::bucket_norm(int li, std::size_t k) const {
  const auto& L = c_.layout.layers()[static_cast<std::size_t>(li)];
  const DType dt = c_.grads.acc_dtype(li);
  const void* g = grad_at(li, grad_offset(li, k, false));
  const std::size_t n = c_.layout.buckets()[L.buckets[k]].shard;
  return c_.plan.acc_on_host(li) ? optim::grad_norm_sq(g, dt, n) : optim::grad_norm_sq(c_.dev, c_.dev_stream, g, dt, n);
}

void OptimizerStep::add_layer_norm(int li, optim::GradNorm& into) const {
  const auto& L = c_.layout.layers()[static_cast<std::size_t>(li)];
  if (L.frozen) return;  // no gradient
  for (std::size_t k = 0; k < L.buckets.size(); ++k) into += bucket_norm(li, k);
}

optim::GradNorm OptimizerStep::pipeline_norm() const {
  // Every stage's (layer id, bucket, sumsq, finite) for this rank's shards, gathered over the
  // stages and added in layer-id order from zero: the bits one engine holding every layer
  // (registered in id order) adds in its loop over layers.
  std::vector<double> mine;
  for (std::size_t li = 0; li < c_.layout.layers().size(); ++li) {
    const auto& L = c_.layout.layers()[li];
    for (std::size_t k = 0; k < L.buckets.size() && !L.frozen; ++k) {
      const optim::GradNorm g = bucket_norm(static_cast<int>(li), k);
      mine.insert(mine.end(), {static_cast<double>(L.id), static_cast<double>(k), g.sumsq, g.finite ? 1.0 : 0.0});
    }
  }
  const auto stages = static_cast<std::size_t>(c_.pipeline->world_size());
  double count = static_cast<double>(mine.size());
  std::vector<double> counts(stages);
  c_.pipeline->all_gather(&count, counts.data(), 2, DType::fp32);  // doubles carried as two fp32 words
  const auto most = static_cast<std::size_t>(*std::max_element(counts.begin(), counts.end()));
  mine.resize(most, -1.0);  // padding: layer id -1
  std::vector<double> all(most * stages);
  c_.pipeline->all_gather(mine.data(), all.data(), 2 * most, DType::fp32);
  std::vector<std::array<double, 4>> entries;
  for (std::size_t i = 0; i + 4 <= all.size(); i += 4) {
    if (all[i] >= 0) entries.push_back({all[i], all[i + 1], all[i + 2], all[i + 3]});
  }
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {  // by (layer id, bucket)
    return a[0] != b[0] ? a[0] < b[0] : a[1] < b[1];
  });
  optim::GradNorm sum;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    STRATA_CHECK(i == 0 || entries[i][0] != entries[i - 1][0] || entries[i][1] != entries[i - 1][1],
                 Errc::invalid_argument, "pipeline: layer ", static_cast<std::int64_t>(entries[i][0]),
                 " is registered on two pipeline stages; each layer belongs to one stage's engine");
    sum += optim::GradNorm{entries[i][2], entries[i][3] != 0.0};
  }
  return sum;
}

double OptimizerStep::averaging() const {
  // Gradients carry loss_scale and are summed over ranks and micro-batches: average them.
  const auto accum = c_.cfg.gradient_accumulation_steps > 0 ? c_.cfg.gradient_accumulation_steps : 1;
  return static_cast<double>(c_.world) * static_cast<double>(accum);
}

StepResult OptimizerStep::run() {
  // The last step's tail, when the trainer touched no layer it had left: this step's lane was
  // never started (nothing handed it a layer), so the step runs synchronously.
  armed_ = -1;
  finish_tail();
  ++calls_;
  const optim::LossScaler::State scaler_before = scaler_.state();
  optim::GradNorm global;
  try {
    global = global_grad_norm();
  } catch (...) {
    cancel_overlap();
    throw;
  }
  const double avg = averaging();
  global.sumsq /= avg * avg;
  const optim::StepPlan plan = optim::plan_step(global, scaler_, c_.cfg.gradient_clipping);
  StepResult result;
  result.skipped = plan.skip;
  result.grad_norm = plan.grad_norm;
  result.loss_scale = plan.loss_scale;
  result.clip_coef = plan.clip_coef;
  tail_layers_ = 0;
  try {
    result.rolled_back = !finish_overlap(plan);
    result.tail_layers = tail_layers_;
  } catch (...) {
    scaler_.restore(scaler_before);  // the failed step counts for nothing but the call
    throw;
  }
  result.deferred = deferred_ && tail_ && !result.rolled_back;
  if (result.rolled_back) {
    STRATA_LOG(info, "rank ", c_.rank, ": the overlapped optimizer step was undone (",
               plan.skip ? "gradient overflow" : "gradient clipping", "); the step runs ",
               tail_ ? "as the tail, during the next forward" : "synchronously");
  }
  if (!plan.skip) clipped_last_ = plan.clip_coef < 1.0;
  if (!plan.skip) {
    result.lr = scheduled_lr(c_.cfg, taken_ + 1);
    const optim::StepArgs a = step_args(plan);
    try {
      run_optimizer(a, result.lr);
    } catch (...) {
      scaler_.restore(scaler_before);  // the failed step counts for nothing but the call
      throw;
    }
    ++taken_;
    c_.homes.refresh();
  } else {
    STRATA_LOG(info, "rank ", c_.rank, ": step skipped: gradient overflow at loss scale ", plan.loss_scale,
               " (next scale ", scaler_.scale(), ")");
  }
  result.step = taken_;
  return result;
}

optim::StepArgs OptimizerStep::step_args(const optim::StepPlan& plan) const {
  optim::StepArgs a;
  a.state_dtype = c_.state.moment_dtype();
  a.copy_dtype = c_.cdt;
  a.grad_scale = static_cast<float>(plan.grad_scale / averaging());
  a.step = taken_ + 1;
  return a;
}

optim::GradNorm OptimizerStep::global_grad_norm() {
  // 1. This rank's share of the squared norm: its shard of every bucket, in bucket order
  //    (pipeline stages: of every stage's layers, in layer-id order).
  optim::GradNorm local;
  if (c_.pipeline != nullptr && c_.pipeline->world_size() > 1) {
    local = pipeline_norm();
  } else {
    for (std::size_t li = 0; li < c_.layout.layers().size(); ++li) add_layer_norm(static_cast<int>(li), local);
  }
  // 2. Combined in rank order on every rank, so every stage and rank sees the same bits.
  optim::GradNorm global = local;
  if (c_.comm != nullptr && c_.world > 1) {
    double mine[2] = {local.sumsq, local.finite ? 1.0 : 0.0};
    std::vector<double> all(2 * static_cast<std::size_t>(c_.world));
    c_.comm->all_gather(mine, all.data(), 4, DType::fp32);  // 16 bytes as four fp32 words
    global = {};
    for (int r = 0; r < c_.world; ++r) global += optim::GradNorm{all[2 * r], all[2 * r + 1] != 0.0};
  }
  return global;
}

void OptimizerStep::update_range(const optim::StepArgs& base, float lr, int li, std::size_t k, std::size_t e0,
                                 std::size_t n, float* master, void* m, void* v, Source from) {
  // Cut the range where the parameters' lr_scale changes (their padding steps at scale 1).
  const auto& L = c_.layout.layers()[static_cast<std::size_t>(li)];
  const auto& b = c_.layout.buckets()[static_cast<std::size_t>(L.buckets[k])];
  const std::size_t first = (c_.cfg.zero.stage == 0 ? 0 : static_cast<std::size_t>(c_.rank) * b.shard) + e0;
  const auto scale_at = [&](std::size_t q, std::size_t& run_end) {  // q: element of the bucket
    if (q >= b.numel) {
      run_end = b.padded;
      return 1.0f;
    }
    const std::size_t at = b.layer_offset + q;
    for (int pi : L.params) {
      const auto& p = c_.layout.params()[static_cast<std::size_t>(pi)];
      if (at >= p.offset && at < p.offset + p.numel) {
        run_end = std::min(b.numel, p.offset + p.numel - b.layer_offset);
        return p.lr_scale;
      }
    }
    run_end = q + 1;
    return 1.0f;
  };
  std::size_t done = 0;
  while (done < n) {
    std::size_t end = 0;
    const float s = scale_at(first + done, end);
    while (end < first + n) {  // the next parameter may step at the same scale: one call for both
      std::size_t next = 0;
      if (scale_at(end, next) != s) break;
      end = next;
    }
    const std::size_t len = std::min(end, first + n) - (first + done);
    const auto& st = c_.state;
    const Source at = from.master == nullptr
                          ? from
                          : Source{from.master + done, st.moment_at(from.m, done), st.moment_at(from.v, done)};
    update_piece(base, lr, s, li, k, e0 + done, len, master + done, st.moment_at(m, done), st.moment_at(v, done), at);
    done += len;
  }
}

void OptimizerStep::update_piece(const optim::StepArgs& base, float lr, float lr_scale, int li, std::size_t k,
                                 std::size_t e0, std::size_t n, float* master, void* m, void* v, Source from) {
  const auto& oc = c_.cfg.optimizer;
  optim::StepArgs a = base;
  a.n = n;
  a.master = master;
  a.m = m;
  a.v = v;
  a.from = {from.master, from.m, from.v};
  a.grad = grad_at(li, grad_offset(li, k, c_.cfg.zero.stage == 0) + e0);
  a.grad_dtype = c_.grads.acc_dtype(li);
  // Updated compute copies go where the parameters live, through host staging, or to a device
  // buffer first (update_staging.h).
  const UpdateStaging::Target target = c_.updates.target(li, k, e0);
  char* copy = target.copy;
  a.copy = c_.cdt == DType::fp32 ? nullptr : copy;  // an fp32 compute copy is the master's bits
  // Decoupled decay (p *= 1 - lr * weight_decay) keeps the base rate; L2 decay is lr-free.
  const float slr = lr * lr_scale, decoupled_wd = oc.weight_decay / lr_scale;
  const bool adamw = oc.type == OptimizerType::adamw;
  const optim::AdamConfig adam{slr,   oc.beta1,          oc.beta2, oc.eps, adamw ? decoupled_wd : oc.weight_decay,
                               adamw, oc.bias_correction};
  const optim::LionConfig lion{slr, oc.beta1, oc.beta2, decoupled_wd};
  const optim::AdagradConfig adagrad{slr, 0.0f, oc.eps, oc.weight_decay};
  STRATA_CHECK(oc.type != OptimizerType::lamb, Errc::internal, "update_range: LAMB steps whole tensors (run_lamb)");
  const bool adam_like = oc.type == OptimizerType::adam || oc.type == OptimizerType::adamw;
  if (c_.plan.opt_tier(li) == Tier::device) {
    // On the device's stream: the CUDA kernels, or the same CPU kernels on the host
    // backend's worker (Lion and Adagrad have no CUDA kernel: setup() refuses them there).
    if (adam_like)
      optim::adam_step_async(c_.dev_stream, adam, a);
    else if (oc.type == OptimizerType::lion)
      c_.dev_stream.launch_host([lion, a] { optim::lion_step(lion, a); });
    else
      c_.dev_stream.launch_host([adagrad, a] { optim::adagrad_step(adagrad, a); });
    if (c_.cdt == DType::fp32) copy_between(c_.dev_stream, copy, Tier::device, a.master, Tier::device, n * 4);
  } else {
    if (adam_like)
      optim::adam_step(adam, a);
    else if (oc.type == OptimizerType::lion)
      optim::lion_step(lion, a);
    else
      optim::adagrad_step(adagrad, a);
    if (c_.cdt == DType::fp32) std::memcpy(copy, a.master, n * 4);  // host: staging or host shards
  }
  if (target.staged) c_.updates.written(li, n);
}

// LAMB (stage 0 only, impl.cc): each tensor whole on the device stream, where its state and
// compute copies may be device memory; its trust ratio needs the whole tensor's norms.
void OptimizerStep::run_lamb(const optim::StepArgs& base, float lr) {
  const auto& oc = c_.cfg.optimizer;
  const bool fp32 = c_.cdt == DType::fp32;
  const std::size_t cbytes = dtype_size(c_.cdt);
  for (std::size_t li = 0; li < c_.layout.layers().size(); ++li) {
    const int l = static_cast<int>(li);
    if (c_.layout.layers()[li].frozen) continue;
    for (int pi : c_.layout.layers()[li].params) {
      const auto& p = c_.layout.params()[pi];
      const optim::LambConfig lamb{lr * p.lr_scale, oc.beta1,           oc.beta2,     oc.eps,
                                   oc.weight_decay, oc.bias_correction, oc.max_coeff, oc.min_coeff};
      optim::StepArgs a = base;
      a.n = p.numel;
      const auto& st = c_.state.resident(l);
      a.master = st.master + p.offset;
      a.m = static_cast<float*>(st.m) + p.offset;  // Lamb keeps fp32 moments (the config refuses bf16)
      a.v = static_cast<float*>(st.v) + p.offset;
      a.grad = grad_at(l, p.offset);
      a.grad_dtype = c_.grads.acc_dtype(l);  // lamb_step takes fp32 (device accumulators, stage 0)
      char* copy = static_cast<char*>(c_.homes.full(l)) + p.offset * cbytes;
      a.copy = fp32 ? nullptr : copy;
      c_.dev_stream.launch_host([lamb, a, copy, fp32] {
        std::vector<float> update(a.n);
        optim::lamb_step(lamb, a, update.data());
        if (fp32) std::memcpy(copy, a.master, a.n * 4);  // an fp32 compute copy is the master's bits
      });
    }
  }
  c_.dev_stream.synchronize();
}

// Sub-groups come in layer then offset order; a sub-group may cover parts of several buckets
// and a bucket may span sub-groups: the optimizer is elementwise, so the bits do not depend on
// where the state is cut.
void OptimizerStep::update_sub_group(const optim::StepArgs& base, float lr, const offload::SubGroup& g) {
  const int li = c_.nvme.swap_layer(static_cast<int>(g.tensor));
  const auto& L = c_.layout.layers()[li];
  for (std::size_t k = 0; k < L.buckets.size(); ++k) {
    const std::size_t b0 = L.shard_offsets[k], b1 = b0 + c_.layout.buckets()[L.buckets[k]].shard;
    const std::size_t lo = std::max<std::size_t>(b0, g.offset), hi = std::min<std::size_t>(b1, g.offset + g.elems);
    if (lo >= hi) continue;
    const std::size_t at = lo - g.offset;
    update_range(base, lr, li, k, lo - b0, hi - lo, g.master + at, c_.state.moment_at(g.exp_avg, at),
                 c_.state.moment_at(g.exp_avg_sq, at));
  }
}

void OptimizerStep::add_swapper_stats(IoStats& io) const {
  if (c_.nvme.swapper() == nullptr) return;
  const auto ss = c_.nvme.swapper()->stats();
  io.nvme_read_bytes += ss.bytes_read;
  io.nvme_write_bytes += ss.bytes_written;
  io.io_wait_seconds += ss.wait_seconds;
}

void OptimizerStep::run_swapped(const optim::StepArgs& base, float lr) {
  auto* swapper = c_.nvme.swapper();
  if (swapper == nullptr || tail_) return;  // a tail finishes the swapper's step and commits it
  if (swapper->pending()) {                 // the overlapped step's update, kept
    swapper->commit_pending();
    return;
  }
  swapper->step([&](const offload::SubGroup& g) { update_sub_group(base, lr, g); });
  add_swapper_stats(c_.io);
}

void OptimizerStep::run_resident(const optim::StepArgs& base, float lr) {
  const int stage = c_.cfg.zero.stage;
  for (std::size_t li = 0; li < c_.layout.layers().size(); ++li) {
    const int l = static_cast<int>(li);
    const auto& L = c_.layout.layers()[li];
    if (L.frozen) continue;
    if (c_.plan.opt_tier(l) == Tier::nvme || (li < host_kept_.size() && host_kept_[li] != 0)) continue;  // the lane's
    Tracer::Span span(c_.plan.opt_tier(l) == Tier::host ? c_.tracer : nullptr, "optimizer",
                      str_cat("adam layer ", L.id, " host"));
    const auto& st = c_.state.resident(l);
    for (std::size_t k = 0; k < L.buckets.size(); ++k) {
      const auto& b = c_.layout.buckets()[L.buckets[k]];
      const std::size_t off = OptimizerState::offset(c_.layout, stage, l, k);
      update_range(base, lr, l, k, 0, stage == 0 ? b.padded : b.shard, st.master + off, c_.state.moment_at(st.m, off),
                   c_.state.moment_at(st.v, off));
    }
    c_.updates.flush_device(l);
  }
  c_.dev_stream.synchronize();  // the device optimizer's updates are in
}

void OptimizerStep::run_optimizer(const optim::StepArgs& base, float lr) {
  try {
    if (c_.cfg.optimizer.type == OptimizerType::lamb) {
      run_lamb(base, lr);
      return;
    }
    run_swapped(base, lr);
    run_resident(base, lr);
    if (auto* store = c_.nvme.params()) c_.nvme.io()->submit([store] { store->commit(); });
  } catch (...) {
    if (tail_) {  // the tail uses the staging and the store that roll_back() drops: it ends first
      try {
        finish_tail();
      } catch (const std::exception& e) {
        STRATA_LOG(error, e.what());
      }
    }
    roll_back();
    throw;
  }
}

void OptimizerStep::roll_back() noexcept {
  // Device work and parameter write-backs already queued may still read or write the
  // buffers dropped below: let them finish.
  c_.settle();
  // The last good parameter shards on NVMe stay current; staged copies are dropped.
  if (auto* store = c_.nvme.params()) store->abort();
  c_.updates.drop();
}

}  // namespace strata::engine
