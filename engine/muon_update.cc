// ShardUpdate::muon_sharded (the protocol in shard_update.h): Muon at ZeRO stages 1-3, where a
// hidden matrix is split across the ranks' shards and its orthogonalization needs it whole.
// The layers whose state is on NVMe go first, through the swapper (muon_swapped.cc); then the
// layers in device memory or host RAM, layer by layer: (1) each rank updates the momentum of its shard's Muon elements
// and writes their update u to host memory; (2) an all-gather per bucket that holds matrix elements puts the layer's
// whole u on every rank, each matrix's owner (its place among the layer's Muon matrices, modulo the world size)
// orthogonalizes it, the owners side by side, and broadcasts the result (a layer without matrices skips both); (3) each
// rank steps its shard: Muon elements by the orthogonalized update, every other run of elements (padding included) with
// AdamW through piece(), compute copies written where UpdateStaging says. Everything is elementwise but the
// orthogonalization, which sees the same whole matrix as at stage 0: the bits are stage 0's.
#include <cstring>
#include <vector>

#include "engine/detail/muon_runs.h"
#include "engine/shard_update.h"
#include "engine/tier_copy.h"
#include "optim/muon.h"
#include "runtime/core/error.h"

namespace strata::engine {

using detail::MuonMatrix;

std::vector<MuonMatrix> ShardUpdate::muon_matrices(int li, float lr) const {
  std::vector<MuonMatrix> matrices;
  if (c_.layout.layers()[static_cast<std::size_t>(li)].frozen) return matrices;
  for (int pi : c_.layout.layers()[static_cast<std::size_t>(li)].params)
    if (detail::muon_matrix(c_.layout, li, pi)) matrices.push_back({pi, muon_config(pi, lr)});
  return matrices;
}

void ShardUpdate::muon_sharded(const optim::StepArgs& base, float lr, IoStats& io) {
  const float adam_lr = muon_adam_lr(lr);
  // The layers on NVMe first: until the swapper's step commits, every layer is as it was.
  muon_swapped(base, lr, adam_lr, io);
  std::vector<float> whole, gathered;
  for (std::size_t li = 0; li < c_.layout.layers().size(); ++li) {
    const int l = static_cast<int>(li);
    const auto& L = c_.layout.layers()[li];
    if (L.frozen || c_.state.tier(l) == Tier::nvme) continue;
    const bool device = c_.state.tier(l) == Tier::device;
    const auto& st = c_.state.resident(l);
    const std::vector<MuonMatrix> matrices = muon_matrices(l, lr);
    // A stream task may read `u` or `whole` until the stream is drained, on the way out too.
    struct Drain {
      device::Stream& stream;
      ~Drain() {
        try {
          stream.synchronize();
        } catch (...) {  // the step's own error is the one to report
        }
      }
    } drain{c_.dev_stream};
    const auto runs = [&](auto&& fn) { detail::for_each_run(c_.layout, L, c_.rank, matrices, fn); };
    // (1) The momentum of this rank's Muon elements, their update u to host memory.
    std::vector<std::vector<float>> u(L.buckets.size());
    for (std::size_t k = 0; k < L.buckets.size() && !matrices.empty(); ++k)
      if (detail::holds_matrix(c_.layout, L, matrices, k))
        u[k].assign(c_.layout.buckets()[static_cast<std::size_t>(L.buckets[k])].shard, 0.0f);
    runs([&](std::size_t k, std::size_t q, std::size_t n, const MuonMatrix* m) {
      if (m == nullptr) return;
      const std::size_t at = OptimizerState::offset(c_.layout, c_.cfg.zero.stage, l, k) + q;
      optim::StepArgs a = base;
      a.n = n;
      a.master = st.master + at;
      a.m = c_.state.moment_at(st.m, at);
      a.grad = c_.grads.acc_at(l, c_.grads.update_offset(l, k, false) + q);
      a.grad_dtype = c_.grads.acc_dtype(l);
      float* out = u[k].data() + q;
      const optim::MuonConfig mc = m->config;
      if (device)
        c_.dev_stream.launch_host([mc, a, out] { optim::muon_momentum(mc, a, out); });
      else
        optim::muon_momentum(mc, a, out);
    });
    if (device) c_.dev_stream.synchronize();
    // (2) The layer's whole u; each matrix orthogonalized by its owner and broadcast.
    if (!matrices.empty())
      detail::gather_and_orthogonalize(c_.layout, L, matrices, u, c_.comm, c_.rank, whole, gathered);
    // (3) This rank's shard stepped: Muon's elements by their orthogonalized update, the rest
    // with AdamW at its own rate.
    runs([&](std::size_t k, std::size_t q, std::size_t n, const MuonMatrix* m) {
      const std::size_t at = OptimizerState::offset(c_.layout, c_.cfg.zero.stage, l, k) + q;
      float* master = st.master + at;
      if (m == nullptr) {
        range(base, adam_lr, l, k, q, n, master, c_.state.moment_at(st.m, at), c_.state.v_at(l, st.v, at));
        return;
      }
      const auto& p = c_.layout.params()[static_cast<std::size_t>(m->pi)];
      const auto& b = c_.layout.buckets()[static_cast<std::size_t>(L.buckets[k])];
      const float* o = whole.data() + b.layer_offset + static_cast<std::size_t>(c_.rank) * b.shard + q;
      const UpdateStaging::Target target = c_.updates.target(l, k, q);
      optim::StepArgs a = base;
      a.n = n;
      a.master = master;
      a.copy = c_.cdt == DType::fp32 ? nullptr : target.copy;
      const optim::MuonConfig mc = m->config;
      const float alr = optim::muon_adjusted_lr(mc, static_cast<int>(p.shape[0]), static_cast<int>(p.shape[1]));
      if (device) {
        c_.dev_stream.launch_host([mc, a, o, alr] { optim::muon_apply(mc, a, o, alr); });
        if (c_.cdt == DType::fp32) copy_between(c_.dev_stream, target.copy, Tier::device, master, Tier::device, n * 4);
      } else {
        optim::muon_apply(mc, a, o, alr);
        if (c_.cdt == DType::fp32) std::memcpy(target.copy, master, n * 4);
      }
      if (target.staged) c_.updates.written(l, n);
    });
    c_.updates.flush_device(l);
  }  // Drain: the layer's updates read `whole`, which the next layer reuses
}

}  // namespace strata::engine
