// ShardUpdate::muon_swapped (the protocol in shard_update.h): Muon at ZeRO stages 1-3 on the
// layers whose state is on NVMe, where no layer's momentum is in memory when its matrices
// must be orthogonalized whole. Two passes over the swapper:
// (1) a scan (StepOrder::read_only) of the layers that hold matrices: in each sub-group read,
//     the matrix elements' momentum is updated in the read buffer, which is never written, and
//     their update u goes to host memory; after a layer's last sub-group its u is gathered and
//     orthogonalized as in memory (muon_runs.h), and this rank's shard of the result is kept;
// (2) the swapper's step over every NVMe layer: each matrix element's momentum is updated
//     again from the same state and gradient (the same bits as in the scan), then its master
//     stepped by the kept result; every other run of elements steps with AdamW through range().
// The scan writes nothing, so a failure before the step commits leaves the last good state on
// NVMe. Its price: a second read of the matrix layers' momentum (the checksum blocks holding
// it: 4 bytes an element and the blocks' rounding, beside the step's 12), and the kept
// result, 4 bytes per element of this rank's shard of those layers, in host RAM until the step.
#include <cstring>
#include <vector>

#include "engine/detail/muon_runs.h"
#include "engine/shard_update.h"
#include "optim/muon.h"

namespace strata::engine {
namespace {

// Calls fn(k, q0, q1, at) for each bucket k of layer L that sub-group g covers: the bucket's
// shard elements [q0, q1), the first of them at element `at` of g.
template <class F> void for_each_piece(const Layout& layout, const LayerLayout& L, const offload::SubGroup& g, F&& fn) {
  for (std::size_t k = 0; k < L.buckets.size(); ++k) {
    const std::size_t b0 = L.shard_offsets[k], b1 = b0 + layout.buckets()[L.buckets[k]].shard;
    const std::size_t lo = std::max<std::size_t>(b0, g.offset), hi = std::min<std::size_t>(b1, g.offset + g.elems);
    if (lo < hi) fn(k, lo - b0, hi - b0, lo - g.offset);
  }
}

}  // namespace

void ShardUpdate::muon_swapped(const optim::StepArgs& base, float lr, float adam_lr, IoStats& io) {
  if (!c_.state.has_swapped()) return;
  // Per layer: its matrices, and (after the scan) this rank's shard of their orthogonalized update.
  const std::size_t layers = c_.layout.layers().size();
  std::vector<std::vector<detail::MuonMatrix>> matrices(layers);
  std::vector<std::vector<float>> kept(layers);
  offload::OptimizerSwapper::StepOrder scan{.read_only = true, .first_moment_only = true};
  for (std::size_t t = 0; t < c_.state.swapped_layers(); ++t) {
    const int l = c_.state.swapped_layer(t);
    matrices[static_cast<std::size_t>(l)] = muon_matrices(l, lr);
    if (!matrices[static_cast<std::size_t>(l)].empty()) scan.tensors.push_back(t);
  }
  // The momentum args of run [q, q + n) of bucket k's shard, at element `at` of sub-group g.
  const auto momentum_args = [&](int l, const offload::SubGroup& g, std::size_t k, std::size_t q, std::size_t n,
                                 std::size_t at) {
    optim::StepArgs a = base;
    a.n = n;
    a.master = g.master + at;
    a.m = c_.state.moment_at(g.exp_avg, at);  // fp32: the config refuses other formats with Muon
    a.grad = c_.grads.acc_at(l, c_.grads.update_offset(l, k, false) + q);
    a.grad_dtype = c_.grads.acc_dtype(l);
    return a;
  };

  // (1) The scan: u of each layer's matrices, gathered and orthogonalized, this rank's shard kept.
  if (!scan.tensors.empty()) {
    std::vector<std::vector<float>> u;
    std::vector<float> whole, gathered;
    auto s = c_.state.begin_swapped(scan);
    while (const auto next = s.peek()) {
      const int l = c_.state.swapped_layer(next->tensor);
      const auto li = static_cast<std::size_t>(l);
      const auto& L = c_.layout.layers()[li];
      if (next->first) {
        u.assign(L.buckets.size(), {});
        for (std::size_t k = 0; k < L.buckets.size(); ++k)
          if (detail::holds_matrix(c_.layout, L, matrices[li], k))
            u[k].assign(c_.layout.buckets()[L.buckets[k]].shard, 0.0f);
      }
      const offload::SubGroup g = s.take();
      for_each_piece(c_.layout, L, g, [&](std::size_t k, std::size_t q0, std::size_t q1, std::size_t at0) {
        detail::for_each_run(c_.layout, L, c_.rank, matrices[li], k, q0, q1,
                             [&](std::size_t, std::size_t q, std::size_t n, const detail::MuonMatrix* m) {
                               if (m == nullptr) return;
                               optim::muon_momentum(m->config, momentum_args(l, g, k, q, n, at0 + (q - q0)),
                                                    u[k].data() + q);
                             });
      });
      s.put();  // the buffer, changed, is never written
      if (!next->last) continue;
      detail::gather_and_orthogonalize(c_.layout, L, matrices[li], u, c_.comm, c_.rank, whole, gathered);
      kept[li].assign(L.shard, 0.0f);
      for (std::size_t k = 0; k < L.buckets.size(); ++k) {
        const auto& b = c_.layout.buckets()[L.buckets[k]];
        const std::size_t first = static_cast<std::size_t>(c_.rank) * b.shard;
        if (u[k].empty() || first >= b.numel) continue;
        std::memcpy(kept[li].data() + L.shard_offsets[k], whole.data() + b.layer_offset + first,
                    std::min(b.shard, b.numel - first) * sizeof(float));
      }
    }
    s.finish();
    c_.state.add_swap_traffic(io);
  }

  // (2) The step: the momentum again, the masters by the kept result, the rest with AdamW.
  std::vector<float> again;  // the momentum pass's u, already in `kept` orthogonalized
  c_.state.step_swapped(
      [&](int l, const offload::SubGroup& g) {
        const auto li = static_cast<std::size_t>(l);
        const auto& L = c_.layout.layers()[li];
        for_each_piece(c_.layout, L, g, [&](std::size_t k, std::size_t q0, std::size_t q1, std::size_t at0) {
          detail::for_each_run(c_.layout, L, c_.rank, matrices[li], k, q0, q1,
                               [&](std::size_t, std::size_t q, std::size_t n, const detail::MuonMatrix* m) {
                                 const std::size_t at = at0 + (q - q0);
                                 if (m == nullptr) {
                                   range(base, adam_lr, l, k, q, n, g.master + at, c_.state.moment_at(g.exp_avg, at),
                                         c_.state.moment_at(g.exp_avg_sq, at));
                                   return;
                                 }
                                 optim::StepArgs a = momentum_args(l, g, k, q, n, at);
                                 again.resize(n);
                                 optim::muon_momentum(m->config, a, again.data());
                                 const auto& p = c_.layout.params()[static_cast<std::size_t>(m->pi)];
                                 const float alr = optim::muon_adjusted_lr(m->config, static_cast<int>(p.shape[0]),
                                                                           static_cast<int>(p.shape[1]));
                                 const UpdateStaging::Target target = c_.updates.target(l, k, q);
                                 a.copy = c_.cdt == DType::fp32 ? nullptr : target.copy;
                                 optim::muon_apply(m->config, a, kept[li].data() + L.shard_offsets[k] + q, alr);
                                 if (c_.cdt == DType::fp32) std::memcpy(target.copy, a.master, n * 4);
                                 if (target.staged) c_.updates.written(l, n);
                               });
        });
      },
      io);
}

}  // namespace strata::engine
