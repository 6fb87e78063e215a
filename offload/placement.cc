// plan_placement() and min_budget_bytes() (see placement.h): the greedy passes, the local
// improvement, the choice among starts and the search for the smallest budget that fits.
#include "offload/placement.h"

#include <algorithm>
#include <numeric>

#include "offload/detail/placement_model.h"
#include "runtime/core/error.h"

namespace strata::offload {
namespace detail {
namespace {

bool try_move(const Model& m, State& s, std::size_t i, int to) {
  const int from = s.place[i];
  if (from >= 0) take(m, s, i);
  if (fits(m, s, i, to)) {
    put(m, s, i, to);
    return true;
  }
  if (from >= 0) put(m, s, i, from);
  return false;
}

std::array<int, 3> by_moved(const Item& it) {
  std::array<int, 3> q{kDevice, kHost, kNvme};
  std::stable_sort(q.begin(), q.end(), [&](int a, int b) { return it.moved[a] < it.moved[b]; });
  return q;
}

std::uint64_t size_of(const Item& it) {
  return std::max({it.bytes[kDevice][kDevice], it.bytes[kHost][kHost], it.bytes[kNvme][kNvme]});
}

__extension__ typedef unsigned __int128 U128;  // exact products of two byte counts

// Sorts by saving/weight descending (exact, in 128 bits; weight 0 first), then larger
// first, then index: a strict weak order even with zero weights.
void sort_by_ratio(const Model& m, std::vector<std::size_t>& v, auto saving, auto weight) {
  std::stable_sort(v.begin(), v.end(), [&](std::size_t a, std::size_t b) {
    const std::uint64_t sa = saving(a), sb = saving(b), wa = weight(a), wb = weight(b);
    if ((wa == 0) != (wb == 0)) return wa == 0;
    const U128 l = wa == 0 ? sa : static_cast<U128>(sa) * wb;
    const U128 r = wa == 0 ? sb : static_cast<U128>(sb) * wa;
    if (l != r) return l > r;
    return size_of(m.items[a]) > size_of(m.items[b]);
  });
}

// An unplaced item that fits nowhere: move one placed item elsewhere to make room, the
// cheapest such pair in moved bytes.
bool evict_for(const Model& m, State& s, std::size_t x) {
  std::uint64_t best = kUnlimited;
  std::size_t best_y = 0;
  int best_q = -1, best_p = -1;
  for (std::size_t y = 0; y < m.items.size(); ++y) {
    const int from = s.place[y];
    if (from < 0 || m.items[y].fixed) continue;
    take(m, s, y);
    for (int q = 0; q < 3; ++q) {
      if (q == from || !fits(m, s, y, q)) continue;
      put(m, s, y, q);
      for (int p = 0; p < 3; ++p) {
        if (fits(m, s, x, p) && s.moved + m.items[x].moved[p] < best) {
          best = s.moved + m.items[x].moved[p];
          best_y = y, best_q = q, best_p = p;
        }
      }
      take(m, s, y);
    }
    put(m, s, y, from);
  }
  if (best_p < 0) return false;
  take(m, s, best_y);
  put(m, s, best_y, best_q);
  put(m, s, x, best_p);
  return true;
}

// Moves x to q, first moving y (if any) to r; keeps the pair only if everything fits and
// fewer bytes move.
bool try_pair(const Model& m, State& s, std::size_t x, int q, std::size_t y, int r) {
  const int px = s.place[x], py = s.place[y];
  const std::uint64_t before = s.moved;
  take(m, s, x);
  take(m, s, y);
  if (fits(m, s, y, r)) {
    put(m, s, y, r);
    if (fits(m, s, x, q)) {
      put(m, s, x, q);
      if (s.moved < before) return true;
      take(m, s, x);
    }
    take(m, s, y);
  }
  put(m, s, y, py);
  put(m, s, x, px);
  return false;
}

// Step 5: single moves to a place that moves fewer bytes; then moves to such a place that
// first move one item there elsewhere; while any fits.
void improve(const Model& m, State& s) {
  for (bool changed = true; changed;) {
    changed = false;
    for (std::size_t x = 0; x < m.items.size(); ++x) {
      const Item& it = m.items[x];
      for (int q = 0; q < 3; ++q) {
        if (!it.fixed && it.moved[q] < it.moved[s.place[x]] && try_move(m, s, x, q)) changed = true;
      }
    }
    for (std::size_t x = 0; x < m.items.size() && !changed; ++x) {
      const Item& it = m.items[x];
      for (int q = 0; q < 3 && !changed; ++q) {
        if (it.fixed || !it.can(q) || it.moved[q] >= it.moved[s.place[x]]) continue;
        for (std::size_t y = 0; y < m.items.size() && !changed; ++y) {
          if (y == x || s.place[y] != q || m.items[y].fixed) continue;
          for (int r = 0; r < 3 && !changed; ++r) {
            if (r != q && m.items[y].can(r)) changed = try_pair(m, s, x, q, y, r);
          }
        }
      }
    }
  }
}

// Steps 1-5 of the protocol in placement.h; `order` is the device pass's order of the
// optimizer items: 0 by traffic saved against the host per device byte, 1 the same
// against NVMe, 2 by size.
State greedy(const Model& m, int order) {
  State s = empty_state(m);
  for (int t = 0; t < 3; ++t) {
    if (s.used[t] > m.cap[t]) return s;
  }
  std::vector<std::size_t> opt, rest;
  for (std::size_t i = 0; i < m.items.size(); ++i) {
    const Item& it = m.items[i];
    if (it.fixed) {
      for (int q = 0; q < 3; ++q) {
        if (it.can(q) && fits(m, s, i, q)) put(m, s, i, q);
      }
    } else if (it.optimizer || m.device_gathers) {
      opt.push_back(i);  // with gathers on the device, a device shard saves the most per byte
    }
  }
  const int fallback = order == 1 ? kNvme : kHost;
  auto device_bytes = [&](std::size_t i) { return m.items[i].bytes[kDevice][kDevice]; };
  if (order == 2) {
    sort_by_ratio(m, opt, device_bytes, [](std::size_t) { return std::uint64_t{1}; });
  } else {
    sort_by_ratio(
        m, opt, [&](std::size_t i) { return m.items[i].moved[fallback] - m.items[i].moved[kDevice]; }, device_bytes);
  }
  for (std::size_t i : opt) try_move(m, s, i, kDevice);
  std::uint64_t host_all = s.used[kHost];
  for (std::size_t i = 0; i < m.items.size(); ++i) {
    if (s.place[i] < 0 && !m.items[i].fixed) {
      rest.push_back(i);
      host_all = sat_add(host_all, m.items[i].bytes[kHost][kHost]);
    }
  }
  const bool nvme =
      m.cap[kNvme] > 0 && std::all_of(rest.begin(), rest.end(), [&](std::size_t i) { return m.items[i].can(kNvme); });
  if (host_all <= m.cap[kHost] || !nvme) {
    // Everything fits on the host, or must: offloaded optimizers first (they missed the
    // device), then params, larger first; what misses goes to the device in step 4.
    std::stable_sort(rest.begin(), rest.end(), [&](std::size_t a, std::size_t b) {
      if (m.items[a].optimizer != m.items[b].optimizer) return m.items[a].optimizer;
      return size_of(m.items[a]) > size_of(m.items[b]);
    });
    for (std::size_t i : rest) try_move(m, s, i, kHost);
  } else {
    std::uint64_t pinned = sat_add(s.used[kHost], m.buffer);
    for (std::size_t i : rest) pinned = sat_add(pinned, m.items[i].bytes[kNvme][kHost]);
    std::uint64_t room = pinned <= m.cap[kHost] ? m.cap[kHost] - pinned : 0;
    auto extra = [&](std::size_t i) { return m.items[i].bytes[kHost][kHost] - m.items[i].bytes[kNvme][kHost]; };
    sort_by_ratio(
        m, rest, [&](std::size_t i) { return m.items[i].moved[kNvme] - m.items[i].moved[kHost]; }, extra);
    std::vector<std::size_t> to_nvme;
    for (std::size_t i : rest) {
      if (pinned <= m.cap[kHost] && extra(i) <= room) {
        room -= extra(i);
        put(m, s, i, kHost);
      } else {
        to_nvme.push_back(i);
      }
    }
    for (std::size_t i : to_nvme) try_move(m, s, i, kNvme);
  }
  // Step 4: params that went to NVMe or nowhere come to the device where they fit.
  std::vector<std::size_t> largest(m.items.size());
  std::iota(largest.begin(), largest.end(), std::size_t{0});
  std::stable_sort(largest.begin(), largest.end(),
                   [&](std::size_t a, std::size_t b) { return size_of(m.items[a]) > size_of(m.items[b]); });
  for (std::size_t i : largest) {
    if (!m.items[i].optimizer && (s.place[i] < 0 || s.place[i] == kNvme)) try_move(m, s, i, kDevice);
  }
  for (std::size_t i : largest) {
    for (int q : by_moved(m.items[i])) {
      if (s.place[i] < 0) try_move(m, s, i, q);
    }
    if (s.place[i] < 0 && !evict_for(m, s, i)) return s;
  }
  improve(m, s);
  return s;
}

}  // namespace

Outcome solve(const Model& m, std::uint64_t nodes) {
  // Three device orders, each also without NVMe: a placement that keeps everything off
  // NVMe saves the swap buffers, which no single move away from NVMe can see.
  Model no_nvme = m;
  no_nvme.cap[kNvme] = 0;
  Outcome o{empty_state(m), false};
  for (int order = 0; order < 6; ++order) {
    if (order >= 3 && m.cap[kNvme] == 0) break;
    State s = greedy(order < 3 ? m : no_nvme, order % 3);
    if (complete(m, s) && (!complete(m, o.state) || s.moved < o.state.moved)) o.state = std::move(s);
  }
  if (nodes > 0) o.optimal = search_placement(m, o.state, nodes);
  if (complete(m, o.state)) improve(m, o.state);
  return o;
}

std::optional<std::uint64_t> min_cap(Model m, int tier, std::uint64_t nodes) {
  std::uint64_t upper = m.base[tier];
  for (const Item& it : m.items) {
    std::uint64_t most = 0;
    for (int q = 0; q < 3; ++q) most = it.can(q) ? std::max(most, it.bytes[q][tier]) : most;
    upper = sat_add(upper, most);
  }
  if (tier == kHost) upper = sat_add(upper, m.buffer);
  if (tier == kNvme) upper = sat_add(upper, m.spare[0] + m.spare[1]);
  const std::uint64_t lowest = tier == kNvme ? 1 : 0;  // an NVMe budget of 0 means unlimited
  upper = std::max(upper, lowest);
  auto works = [&](std::uint64_t b) {
    m.cap[tier] = b;
    return complete(m, solve(m, nodes).state);
  };
  if (!works(upper)) return std::nullopt;
  if (works(lowest)) return lowest;
  std::uint64_t lo = lowest, hi = upper;  // works(lo) is false, works(hi) true
  while (hi - lo > 1) {
    const std::uint64_t mid = lo + (hi - lo) / 2;
    (works(mid) ? hi : lo) = mid;
  }
  return hi;
}

}  // namespace detail

using namespace detail;

std::uint64_t Placement::moved_bytes() const noexcept {
  return h2d_bytes + d2h_bytes + nvme_read_bytes + nvme_write_bytes;
}

std::optional<std::uint64_t> min_budget_bytes(const PlacementProblem& problem, Tier tier) {
  const Model m = build_model(problem);
  if (tier == Tier::nvme && !problem.nvme_available) return std::nullopt;
  return min_cap(m, static_cast<int>(tier), problem.search_nodes);
}

namespace {

// The Placement of a complete state: places per layer, tier bytes and the flows per step.
Placement placement_of(const detail::Model& m, const detail::State& s, std::size_t layers) {
  Placement out;
  out.layers.resize(layers);
  for (std::size_t i = 0; i < layers; ++i) {
    if (m.opt_item[i] >= 0) out.layers[i].optimizer = static_cast<Tier>(s.place[m.opt_item[i]]);
    if (m.param_item[i] >= 0) out.layers[i].params = static_cast<Tier>(s.place[m.param_item[i]]);
  }
  out.tier_bytes = s.used;
  for (std::size_t i = 0; i < m.items.size(); ++i) {
    const auto& f = m.items[i].flow[s.place[i]];
    out.h2d_bytes += f[kH2d];
    out.d2h_bytes += f[kD2h];
    out.nvme_read_bytes += f[kNvmeRead];
    out.nvme_write_bytes += f[kNvmeWrite];
  }
  return out;
}

}  // namespace

Placement plan_placement(const PlacementProblem& problem) {
  const Model m = build_model(problem);
  const Outcome o = solve(m, problem.search_nodes);
  if (!complete(m, o.state)) STRATA_THROW(Errc::out_of_budget, refusal_message(problem, m));
  Placement out = placement_of(m, o.state, problem.layers.size());
  out.proven_optimal = o.optimal;
  return out;
}

Placement evaluate_placement(PlacementProblem problem, const std::vector<LayerPlacement>& layers) {
  STRATA_CHECK(layers.size() == problem.layers.size(), Errc::invalid_argument, "placement: ", layers.size(),
               " layer places for ", problem.layers.size(), " layers");
  problem.optimizer_fixed.reset();  // a place the static form chose need not be the fixed one (max_in_cpu)
  problem.params_fixed.reset();
  problem.nvme_available = true;
  const Model m = build_model(problem);
  State s = empty_state(m);
  for (std::size_t i = 0; i < layers.size(); ++i) {
    if (m.opt_item[i] >= 0) put(m, s, static_cast<std::size_t>(m.opt_item[i]), static_cast<int>(layers[i].optimizer));
    if (m.param_item[i] >= 0) put(m, s, static_cast<std::size_t>(m.param_item[i]), static_cast<int>(layers[i].params));
  }
  return placement_of(m, s, layers.size());
}

}  // namespace strata::offload
