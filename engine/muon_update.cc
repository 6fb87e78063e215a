// ShardUpdate::muon_sharded (the protocol in shard_update.h): Muon at ZeRO stages 1-3, where a
// hidden matrix is split across the ranks' shards and its orthogonalization needs it whole.
// Layer by layer: (1) each rank updates the momentum of its shard's Muon elements and writes
// their update u to host memory; (2) an all-gather per bucket that holds matrix elements puts
// the layer's whole u on every rank, each matrix's owner (its place among the layer's Muon
// matrices, modulo the world size) orthogonalizes it, the owners side by side, and broadcasts
// the result (a layer without matrices skips both); (3) each rank steps its shard: Muon elements by
// the orthogonalized update, every other run of elements (padding included) with AdamW through
// piece(), compute copies written where UpdateStaging says. Everything is elementwise but the
// orthogonalization, which sees the same whole matrix as at stage 0: the bits are stage 0's.
#include <algorithm>
#include <cstring>
#include <vector>

#include "engine/shard_update.h"
#include "engine/tier_copy.h"
#include "optim/muon.h"
#include "runtime/core/error.h"

namespace strata::engine {
namespace {

// A Muon matrix of a layer: its parameter and its config.
struct Matrix {
  int pi;
  optim::MuonConfig config;
};

// Calls fn(k, q, n, matrix or null) for the runs [q, q + n) of `rank`'s shard of each bucket
// of layer L: a matrix's elements, or anything else (other parameters, padding).
template <class F>
void for_each_run(const Layout& layout, const LayerLayout& L, int rank, const std::vector<Matrix>& matrices, F&& fn) {
  for (std::size_t k = 0; k < L.buckets.size(); ++k) {
    const auto& b = layout.buckets()[static_cast<std::size_t>(L.buckets[k])];
    const std::size_t first = static_cast<std::size_t>(rank) * b.shard;  // in the bucket
    const std::size_t base_e = b.layer_offset + first;                   // its layer element
    for (std::size_t q = 0; q < b.shard;) {
      const std::size_t e = base_e + q;
      const bool real = first + q < b.numel;
      const Matrix* kind = nullptr;
      std::size_t end = b.shard;
      for (const auto& m : matrices) {
        const auto& p = layout.params()[static_cast<std::size_t>(m.pi)];
        if (real && e >= p.offset && e < p.offset + p.numel) {
          kind = &m;
          end = std::min(b.shard, p.offset + p.numel - base_e);
          break;
        }
      }
      if (kind == nullptr) {  // up to the next matrix that starts in this bucket
        for (const auto& m : matrices) {
          const auto& p = layout.params()[static_cast<std::size_t>(m.pi)];
          if (p.offset > e && p.offset < b.layer_offset + b.numel) end = std::min(end, p.offset - base_e);
        }
      }
      fn(k, q, end - q, kind);
      q = end;
    }
  }
}

// Phase (2): layer L's whole u in `whole` from each rank's bucket shards `u` (empty: a bucket
// without matrix elements), each matrix orthogonalized by its owner, the owners side by side,
// then broadcast. `gathered` is scratch.
void gather_and_orthogonalize(const Layout& layout, const LayerLayout& L, const std::vector<Matrix>& matrices,
                              const std::vector<std::vector<float>>& u, comm::Communicator* comm, int rank,
                              std::vector<float>& whole, std::vector<float>& gathered) {
  const int world = comm == nullptr ? 1 : comm->world_size();
  whole.assign(L.numel, 0.0f);
  for (std::size_t k = 0; k < L.buckets.size(); ++k) {
    if (u[k].empty()) continue;
    const auto& b = layout.buckets()[static_cast<std::size_t>(L.buckets[k])];
    const float* all = u[k].data();
    if (world > 1) {
      gathered.resize(b.padded);
      comm->all_gather(u[k].data(), gathered.data(), b.shard, DType::fp32);
      all = gathered.data();
    }
    std::memcpy(whole.data() + b.layer_offset, all, b.numel * sizeof(float));
  }
  const auto owner = [&](std::size_t i) { return static_cast<int>(i % static_cast<std::size_t>(world)); };
  optim::MuonScratch scratch;
  for (std::size_t i = 0; i < matrices.size(); ++i) {
    if (owner(i) != rank) continue;
    const auto& p = layout.params()[static_cast<std::size_t>(matrices[i].pi)];
    optim::newton_schulz(whole.data() + p.offset, static_cast<int>(p.shape[0]), static_cast<int>(p.shape[1]),
                         matrices[i].config.ns, scratch.ns);
  }
  for (std::size_t i = 0; i < matrices.size() && world > 1; ++i) {
    const auto& p = layout.params()[static_cast<std::size_t>(matrices[i].pi)];
    comm->broadcast(whole.data() + p.offset, p.numel, DType::fp32, owner(i));
  }
}

}  // namespace

void ShardUpdate::muon_sharded(const optim::StepArgs& base, float lr) {
  const float adam_lr = muon_adam_lr(lr);
  std::vector<float> whole, gathered;
  for (std::size_t li = 0; li < c_.layout.layers().size(); ++li) {
    const int l = static_cast<int>(li);
    const auto& L = c_.layout.layers()[li];
    if (L.frozen) continue;
    const bool device = c_.state.tier(l) == Tier::device;
    const auto& st = c_.state.resident(l);
    // The Muon matrices of the layer and their configs, in registration order.
    std::vector<Matrix> matrices;
    for (int pi : L.params) {
      if (!muon_matrix(l, pi)) continue;
      matrices.push_back({pi, muon_config(pi, lr)});
    }
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
    const auto runs = [&](auto&& fn) { for_each_run(c_.layout, L, c_.rank, matrices, fn); };
    // Whether bucket k holds elements of a matrix (the layout's: the same on every rank).
    const auto holds_matrix = [&](std::size_t k) {
      const auto& b = c_.layout.buckets()[static_cast<std::size_t>(L.buckets[k])];
      for (const auto& m : matrices) {
        const auto& p = c_.layout.params()[static_cast<std::size_t>(m.pi)];
        if (p.offset < b.layer_offset + b.numel && p.offset + p.numel > b.layer_offset) return true;
      }
      return false;
    };
    // (1) The momentum of this rank's Muon elements, their update u to host memory.
    std::vector<std::vector<float>> u(L.buckets.size());
    for (std::size_t k = 0; k < L.buckets.size() && !matrices.empty(); ++k)
      if (holds_matrix(k)) u[k].assign(c_.layout.buckets()[static_cast<std::size_t>(L.buckets[k])].shard, 0.0f);
    runs([&](std::size_t k, std::size_t q, std::size_t n, const Matrix* m) {
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
    if (!matrices.empty()) gather_and_orthogonalize(c_.layout, L, matrices, u, c_.comm, c_.rank, whole, gathered);
    // (3) This rank's shard stepped: Muon's elements by their orthogonalized update, the rest
    // with AdamW at its own rate.
    runs([&](std::size_t k, std::size_t q, std::size_t n, const Matrix* m) {
      const std::size_t at = OptimizerState::offset(c_.layout, c_.cfg.zero.stage, l, k) + q;
      float* master = st.master + at;
      if (m == nullptr) {
        range(base, adam_lr, l, k, q, n, master, c_.state.moment_at(st.m, at), c_.state.moment_at(st.v, at));
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
