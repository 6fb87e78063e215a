// Step 6 of the placement protocol (placement.h): depth-first branch and bound over every
// item's places, largest items first, each item's places cheapest first. A branch is cut
// when the bytes it moves plus the least the remaining items can move reach the best
// placement found so far, or when the remaining items cannot fit in device + host memory.
#include <algorithm>
#include <numeric>

#include "offload/detail/placement_model.h"

namespace strata::offload::detail {
namespace {

struct Search {
  const Model& m;
  State& best;
  std::uint64_t best_moved;
  std::uint64_t node_limit, nodes = 0;
  bool aborted = false;
  std::vector<std::size_t> order;                   // item per depth
  std::vector<std::array<int, 3>> places;           // per depth: places by moved bytes
  std::vector<std::uint64_t> rest_moved, rest_mem;  // per depth: least of the items from here on
  std::uint64_t mem_cap;                            // device + host
  State s;

  void dfs(std::size_t k) {
    if (++nodes > node_limit) {
      aborted = true;
      return;
    }
    if (k == order.size()) {
      if (s.moved < best_moved) {
        best = s;
        best_moved = s.moved;
      }
      return;
    }
    const std::size_t i = order[k];
    const Item& it = m.items[i];
    for (int q : places[k]) {
      if (!it.can(q)) continue;
      if (sat_add(s.moved + it.moved[q], rest_moved[k + 1]) >= best_moved) break;
      if (!fits(m, s, i, q)) continue;
      put(m, s, i, q);
      if (sat_add(s.used[kDevice] + s.used[kHost], rest_mem[k + 1]) <= mem_cap) dfs(k + 1);
      take(m, s, i);
      if (aborted) return;
    }
  }
};

}  // namespace

bool search_placement(const Model& m, State& best, std::uint64_t node_limit) {
  Search x{m, best, complete(m, best) ? best.moved : kUnlimited, node_limit};
  x.s = empty_state(m);
  for (int t = 0; t < 3; ++t) {
    if (x.s.used[t] > m.cap[t]) return true;  // the fixed parts alone overflow: nothing fits
  }
  const std::size_t n = m.items.size();
  auto size_of = [&](std::size_t i) {
    const Item& it = m.items[i];
    return std::max({it.bytes[kDevice][kDevice], it.bytes[kHost][kHost], it.bytes[kNvme][kNvme]});
  };
  x.order.resize(n);
  std::iota(x.order.begin(), x.order.end(), std::size_t{0});
  std::stable_sort(x.order.begin(), x.order.end(),
                   [&](std::size_t a, std::size_t b) { return size_of(a) > size_of(b); });
  x.places.resize(n);
  x.rest_moved.assign(n + 1, 0);
  x.rest_mem.assign(n + 1, 0);
  for (std::size_t k = n; k-- > 0;) {
    const Item& it = m.items[x.order[k]];
    x.places[k] = {kDevice, kHost, kNvme};
    std::stable_sort(x.places[k].begin(), x.places[k].end(), [&](int a, int b) { return it.moved[a] < it.moved[b]; });
    std::uint64_t least_moved = kUnlimited, least_mem = kUnlimited;
    for (int q = 0; q < 3; ++q) {
      if (!it.can(q)) continue;
      least_moved = std::min(least_moved, it.moved[q]);
      least_mem = std::min(least_mem, it.bytes[q][kDevice] + it.bytes[q][kHost]);
    }
    x.rest_moved[k] = sat_add(x.rest_moved[k + 1], least_moved);
    x.rest_mem[k] = sat_add(x.rest_mem[k + 1], least_mem);
  }
  x.mem_cap = sat_add(m.cap[kDevice], m.cap[kHost]);
  x.dfs(0);
  return !x.aborted;
}

}  // namespace strata::offload::detail
