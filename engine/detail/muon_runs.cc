// The gather and orthogonalization of a layer's Muon update (the protocol in muon_runs.h).
#include "engine/detail/muon_runs.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <string>

namespace strata::engine::detail {

bool muon_matrix(const Layout& layout, int li, int pi) {
  const auto n = static_cast<int>(layout.layers().size());
  const auto& p = layout.params()[static_cast<std::size_t>(pi)];
  if (li == 0 || li + 1 == n || p.shape.size() != 2) return false;
  // An embedding table is a 2-D parameter too, and a host trainer may give it a layer of its
  // own (a position embedding after the token embedding's layer): its name tells it.
  std::string name = p.name;
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char ch) { return std::tolower(ch); });
  for (const char* part : {"emb", "wte", "wpe", "lm_head"})
    if (name.find(part) != std::string::npos) return false;
  return true;
}

bool holds_muon_matrix(const Layout& layout, int li) {
  const auto& L = layout.layers()[static_cast<std::size_t>(li)];
  if (L.frozen) return false;
  return std::any_of(L.params.begin(), L.params.end(), [&](int pi) { return muon_matrix(layout, li, pi); });
}

bool holds_matrix(const Layout& layout, const LayerLayout& L, const std::vector<MuonMatrix>& matrices, std::size_t k) {
  const auto& b = layout.buckets()[static_cast<std::size_t>(L.buckets[k])];
  for (const auto& m : matrices) {
    const auto& p = layout.params()[static_cast<std::size_t>(m.pi)];
    if (p.offset < b.layer_offset + b.numel && p.offset + p.numel > b.layer_offset) return true;
  }
  return false;
}

std::vector<StateRun> state_runs(const Layout& layout, int stage, int rank, int li) {
  const auto& L = layout.layers()[static_cast<std::size_t>(li)];
  std::vector<MuonMatrix> matrices;
  for (int pi : L.params)
    if (muon_matrix(layout, li, pi)) matrices.push_back({pi, {}});
  std::vector<StateRun> runs;
  for (std::size_t k = 0; k < L.buckets.size(); ++k) {
    const auto& b = layout.buckets()[static_cast<std::size_t>(L.buckets[k])];
    const std::size_t at = stage == 0 ? b.flat_offset - L.flat_offset : L.shard_offsets[k];
    const std::size_t first = stage == 0 ? 0 : static_cast<std::size_t>(rank) * b.shard;
    for_each_run_from(
        layout, L, first, matrices, k, 0, stage == 0 ? b.padded : b.shard,
        [&](std::size_t, std::size_t q, std::size_t n, const MuonMatrix* m) {
          if (!runs.empty() && runs.back().matrix == (m != nullptr) && runs.back().at + runs.back().n == at + q)
            runs.back().n += n;
          else
            runs.push_back({at + q, n, m != nullptr});
        });
  }
  return runs;
}

std::uint64_t fewest_matrix_elems(const Layout& layout, int stage, int li) {
  std::uint64_t fewest = ~std::uint64_t{0};
  for (int r = 0; r < (stage == 0 ? 1 : layout.world_size()); ++r) {
    std::uint64_t n = 0;
    for (const auto& run : state_runs(layout, stage, r, li)) n += run.matrix ? run.n : 0;
    fewest = std::min(fewest, n);
  }
  return fewest;
}

std::uint64_t muon_host_scratch(const Layout& layout, int world) {
  std::uint64_t most = 0;
  for (std::size_t li = 0; li < layout.layers().size(); ++li) {
    const int l = static_cast<int>(li);
    if (!holds_muon_matrix(layout, l)) continue;
    const auto& L = layout.layers()[li];
    std::uint64_t bucket = 0, ns = 0;
    for (int k : L.buckets)  // gather_and_orthogonalize() all-gathers into a bucket's buffer on 2+ ranks
      if (world > 1) bucket = std::max<std::uint64_t>(bucket, layout.buckets()[static_cast<std::size_t>(k)].padded);
    for (int pi : L.params) {
      if (!muon_matrix(layout, l, pi)) continue;
      const auto& p = layout.params()[static_cast<std::size_t>(pi)];
      const std::uint64_t r = std::min(p.shape[0], p.shape[1]), rc = p.shape[0] * p.shape[1];
      ns = std::max(ns, 2 * rc + 2 * r * r);  // newton_schulz's X, then an iteration's X^T and two r x r
    }
    most = std::max(most, 4 * (L.numel + L.shard + bucket + ns));
  }
  return most;
}

void gather_and_orthogonalize(const Layout& layout, const LayerLayout& L, const std::vector<MuonMatrix>& matrices,
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

}  // namespace strata::engine::detail
