// The parameter ranges inside a run of a layer's flat buffer, as checkpoints address them
// (a tensor's elements by their place in the tensor): shared by the save (checkpoint.cc)
// and the load (checkpoint_load.cc), so both cut the same ranges.
#pragma once

#include <algorithm>
#include <cstddef>

#include "engine/layout.h"

namespace strata::engine::detail {

// Calls fn(param index, first element in the param, array index, count) for each part of
// the piece `pc` (Engine::Impl::Piece) that holds a parameter (padding between and after
// parameters is skipped).
template <class Piece, class Fn>
void for_each_param_range(const Layout& lay, const LayerLayout& L, const Piece& pc, Fn&& fn) {
  for (int pi : L.params) {
    const auto& p = lay.params()[pi];
    const std::size_t lo = std::max(pc.pos, p.offset), hi = std::min(pc.pos + pc.len, p.offset + p.numel);
    if (lo < hi) fn(pi, lo - p.offset, pc.index + (lo - pc.pos), hi - lo);
  }
}

}  // namespace strata::engine::detail
