// What Muon's two paths at ZeRO stages 1-3 share (muon_update.cc, the layers in memory;
// muon_swapped.cc, the layers on NVMe): a layer's hidden matrices, the runs of a rank's
// shard that are a matrix's elements or not, and the gather of a layer's update, each matrix
// orthogonalized by its owner (its place among the layer's matrices, modulo the world size),
// the owners side by side, then broadcast.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/layout.h"
#include "optim/muon.h"
#include "runtime/comm/communicator.h"

namespace strata::engine::detail {

// Whether parameter pi of layer li is a hidden matrix, the ones Muon steps: a 2-D parameter
// outside the first and the last layer whose name does not name an embedding ("emb", "wte",
// "wpe", "lm_head"), with its registered shape as rows x cols.
bool muon_matrix(const Layout& layout, int li, int pi);
// Whether layer li holds one (a frozen layer holds none: it takes no step).
bool holds_muon_matrix(const Layout& layout, int li);

// Host bytes Muon's step at ZeRO stages 1-3 uses at most for one layer at a time: the layer's
// gathered update, this rank's part of it, one bucket's all-gather (on more than one rank) and
// the orthogonalization's scratch for its largest matrix (0 without hidden matrices).
std::uint64_t muon_host_scratch(const Layout& layout, int world);

// A Muon matrix of a layer: its parameter and its config.
struct MuonMatrix {
  int pi;
  optim::MuonConfig config;
};

// Calls fn(k, q, n, matrix or null) for the runs [q, q + n) of bucket k of layer L within
// [q0, q1), counted from its element `first` (a rank's shard: rank x shard; the whole bucket:
// 0): a matrix's elements, or anything else (other parameters, padding).
template <class F> void for_each_run_from(const Layout& layout, const LayerLayout& L, std::size_t first,
                                          const std::vector<MuonMatrix>& matrices, std::size_t k, std::size_t q0,
                                          std::size_t q1, F&& fn) {
  const auto& b = layout.buckets()[static_cast<std::size_t>(L.buckets[k])];
  const std::size_t base_e = b.layer_offset + first;  // its layer element
  for (std::size_t q = q0; q < q1;) {
    const std::size_t e = base_e + q;
    const bool real = first + q < b.numel;
    const MuonMatrix* kind = nullptr;
    std::size_t end = q1;
    for (const auto& m : matrices) {
      const auto& p = layout.params()[static_cast<std::size_t>(m.pi)];
      if (real && e >= p.offset && e < p.offset + p.numel) {
        kind = &m;
        end = std::min(q1, p.offset + p.numel - base_e);
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

// The runs of `rank`'s shard of bucket k of layer L within [q0, q1) (elements of the shard).
template <class F> void for_each_run(const Layout& layout, const LayerLayout& L, int rank,
                                     const std::vector<MuonMatrix>& matrices, std::size_t k, std::size_t q0,
                                     std::size_t q1, F&& fn) {
  const auto& b = layout.buckets()[static_cast<std::size_t>(L.buckets[k])];
  for_each_run_from(layout, L, static_cast<std::size_t>(rank) * b.shard, matrices, k, q0, q1, fn);
}

// The same over the whole shard of every bucket of the layer.
template <class F> void for_each_run(const Layout& layout, const LayerLayout& L, int rank,
                                     const std::vector<MuonMatrix>& matrices, F&& fn) {
  for (std::size_t k = 0; k < L.buckets.size(); ++k)
    for_each_run(layout, L, rank, matrices, k, 0, layout.buckets()[static_cast<std::size_t>(L.buckets[k])].shard, fn);
}

// The runs of layer li's optimizer state on `rank` in state order (the padded layer at stage 0,
// the rank's shard above): its first element, its length, whether a hidden matrix's.
struct StateRun {
  std::size_t at, n;
  bool matrix;
};
std::vector<StateRun> state_runs(const Layout& layout, int stage, int rank, int li);
// The elements of hidden matrices in layer li's state on the rank that holds the fewest: what
// placement counts, the same on every rank.
std::uint64_t fewest_matrix_elems(const Layout& layout, int stage, int li);

// Whether bucket k of layer L holds elements of a matrix (the layout's: the same on every rank).
bool holds_matrix(const Layout& layout, const LayerLayout& L, const std::vector<MuonMatrix>& matrices, std::size_t k);

// Layer L's whole update u in `whole` from each rank's bucket shards `u` (empty: a bucket
// without matrix elements), each matrix orthogonalized by its owner, the owners side by side,
// then broadcast. `gathered` is scratch.
void gather_and_orthogonalize(const Layout& layout, const LayerLayout& L, const std::vector<MuonMatrix>& matrices,
                              const std::vector<std::vector<float>>& u, comm::Communicator* comm, int rank,
                              std::vector<float>& whole, std::vector<float>& gathered);

}  // namespace strata::engine::detail
