// ShardUpdate (the protocol in shard_update.h): a range cut at lr_scale changes, each piece
// stepped by its optimizer on the side that holds its state.
#include "engine/shard_update.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "engine/tier_copy.h"
#include "optim/adagrad.h"
#include "optim/adam.h"
#include "optim/device_step.h"
#include "optim/lion.h"
#include "runtime/core/error.h"
#include "runtime/core/log.h"

namespace strata::engine {

void ShardUpdate::range(const optim::StepArgs& base, float lr, int li, std::size_t k, std::size_t e0, std::size_t n,
                        float* master, void* m, void* v, Source from) {
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
    piece(base, lr, s, li, k, e0 + done, len, master + done, st.moment_at(m, done), st.moment_at(v, done), at);
    done += len;
  }
}

void ShardUpdate::piece(const optim::StepArgs& base, float lr, float lr_scale, int li, std::size_t k, std::size_t e0,
                        std::size_t n, float* master, void* m, void* v, Source from) {
  const auto& oc = c_.cfg.optimizer;
  optim::StepArgs a = base;
  a.n = n;
  a.master = master;
  a.m = m;
  a.v = v;
  a.from = {from.master, from.m, from.v};
  a.grad = c_.grads.acc_at(li, c_.grads.update_offset(li, k, c_.cfg.zero.stage == 0) + e0);
  a.grad_dtype = c_.grads.acc_dtype(li);
  // Updated compute copies go where the parameters live, through host staging, or to a device
  // buffer first (update_staging.h).
  const UpdateStaging::Target target = c_.updates.target(li, k, e0);
  char* copy = target.copy;
  a.copy = c_.cdt == DType::fp32 ? nullptr : copy;  // an fp32 compute copy is the master's bits
  // Decoupled decay (p *= 1 - lr * weight_decay) keeps the base rate; L2 decay is lr-free.
  const float slr = lr * lr_scale, decoupled_wd = oc.weight_decay / lr_scale;
  // Muon steps everything but its hidden matrices with AdamW (muon_sharded passes its rate).
  const bool adamw = oc.type == OptimizerType::adamw || oc.type == OptimizerType::muon;
  const optim::AdamConfig adam{slr,   oc.beta1,          oc.beta2, oc.eps, adamw ? decoupled_wd : oc.weight_decay,
                               adamw, oc.bias_correction};
  const optim::LionConfig lion{slr, oc.beta1, oc.beta2, decoupled_wd};
  const optim::AdagradConfig adagrad{slr, 0.0f, oc.eps, oc.weight_decay};
  STRATA_CHECK(oc.type != OptimizerType::lamb, Errc::internal, "ShardUpdate::range: LAMB steps whole tensors (lamb)");
  const bool adam_like = oc.type == OptimizerType::adam || adamw;
  if (c_.state.tier(li) == Tier::device) {
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

// Sub-groups come in layer then offset order; a sub-group may cover parts of several buckets
// and a bucket may span sub-groups: the optimizer is elementwise (q8: blockwise, cut only at
// block edges), so the bits do not depend on where the state is cut.
void ShardUpdate::sub_group(const optim::StepArgs& base, float lr, int li, const offload::SubGroup& g) {
  const auto& L = c_.layout.layers()[li];
  for (std::size_t k = 0; k < L.buckets.size(); ++k) {
    const std::size_t b0 = L.shard_offsets[k], b1 = b0 + c_.layout.buckets()[L.buckets[k]].shard;
    const std::size_t lo = std::max<std::size_t>(b0, g.offset), hi = std::min<std::size_t>(b1, g.offset + g.elems);
    if (lo >= hi) continue;
    const std::size_t at = lo - g.offset;
    range(base, lr, li, k, lo - b0, hi - lo, g.master + at, c_.state.moment_at(g.exp_avg, at),
          c_.state.moment_at(g.exp_avg_sq, at));
  }
}

void ShardUpdate::swapped(const optim::StepArgs& base, float lr, IoStats& io) {
  c_.state.step_swapped([&](int li, const offload::SubGroup& g) { sub_group(base, lr, li, g); }, io);
}

void ShardUpdate::abort() noexcept {
  c_.updates.abort_params();
  c_.updates.drop();
}

void ShardUpdate::resident(const optim::StepArgs& base, float lr, const std::vector<char>& skip) {
  const int stage = c_.cfg.zero.stage;
  for (std::size_t li = 0; li < c_.layout.layers().size(); ++li) {
    const int l = static_cast<int>(li);
    const auto& L = c_.layout.layers()[li];
    if (L.frozen || c_.state.tier(l) == Tier::nvme || (li < skip.size() && skip[li] != 0)) continue;
    Tracer::Span span(c_.state.tier(l) == Tier::host ? c_.tracer : nullptr, "optimizer",
                      str_cat("adam layer ", L.id, " host"));
    const auto& st = c_.state.resident(l);
    for (std::size_t k = 0; k < L.buckets.size(); ++k) {
      const auto& b = c_.layout.buckets()[L.buckets[k]];
      const std::size_t off = OptimizerState::offset(c_.layout, stage, l, k);
      range(base, lr, l, k, 0, stage == 0 ? b.padded : b.shard, st.master + off, c_.state.moment_at(st.m, off),
            c_.state.moment_at(st.v, off));
    }
    c_.updates.flush_device(l);
  }
  c_.dev_stream.synchronize();  // the device optimizer's updates are in
}

void ShardUpdate::out_of_place(const optim::StepArgs& base, float lr, int li) {
  const int stage = c_.cfg.zero.stage;
  const auto& L = c_.layout.layers()[static_cast<std::size_t>(li)];
  const auto& st = c_.state;
  const auto& from = c_.state.resident(li);
  const auto& to = c_.state.spare(li);
  // The state this optimizer does not use (Lion's v, Adagrad's m) carries over as it is.
  const std::size_t bytes = moment_bytes(c_.state.moment_format(), c_.state.elems(li));
  if (c_.cfg.optimizer.type == OptimizerType::lion) std::memcpy(to.v, from.v, bytes);
  if (c_.cfg.optimizer.type == OptimizerType::adagrad) std::memcpy(to.m, from.m, bytes);
  for (std::size_t k = 0; k < L.buckets.size(); ++k) {
    const auto& b = c_.layout.buckets()[L.buckets[k]];
    const std::size_t off = OptimizerState::offset(c_.layout, stage, li, k);
    range(base, lr, li, k, 0, stage == 0 ? b.padded : b.shard, to.master + off, st.moment_at(to.m, off),
          st.moment_at(to.v, off), {from.master + off, st.moment_at(from.m, off), st.moment_at(from.v, off)});
  }
}

template <class Fn> void ShardUpdate::committed_masters(int li, const Fn& fn) {
  if (c_.state.tier(li) != Tier::nvme)
    fn(std::uint64_t{0}, static_cast<const float*>(c_.state.resident(li).master), std::uint64_t{c_.state.elems(li)});
  else
    c_.state.committed_masters(li, fn);
}

void ShardUpdate::restore_copies(int li) {
  if (rebuild_stale_shard(li)) return;
  committed_masters(li, [&](std::uint64_t first, const float* master, std::uint64_t n) {
    c_.updates.restore_copies(li, first, n, master);
  });
}

void ShardUpdate::rebuild_stale_shards() noexcept {
  for (std::size_t li = 0; li < c_.layout.layers().size(); ++li) {
    try {
      (void)rebuild_stale_shard(static_cast<int>(li));
    } catch (const std::exception& e) {
      STRATA_LOG(error, "rank ", c_.rank, ": rebuilding layer ", c_.layout.layers()[li].id,
                 "'s parameter shard from its masters failed: ", e.what(),
                 "; it stays refused until a checkpoint is loaded");
    }
  }
}

bool ShardUpdate::rebuild_stale_shard(int li) {
  if (!c_.updates.params_stale(li)) return false;
  const std::size_t cbytes = dtype_size(c_.cdt);
  STRATA_CHECK(c_.state.elems(li) == c_.layout.layer_shard(li), Errc::internal, "layer ", li, ": ", c_.state.elems(li),
               " optimizer elements for a shard of ", c_.layout.layer_shard(li));
  std::vector<char> shard(c_.state.elems(li) * cbytes);
  committed_masters(li, [&](std::uint64_t first, const float* master, std::uint64_t n) {
    convert(master, DType::fp32, shard.data() + first * cbytes, c_.cdt, n);
  });
  c_.updates.rewrite_params(li, shard.data());
  return true;
}

}  // namespace strata::engine
