// The parameter ranges inside a run of a layer's flat buffer, as checkpoints address them
// (a tensor's elements by their place in the tensor), and the collective outcome of each
// phase of a save or load: shared by the save (checkpoint_save.h), the load
// (checkpoint_load.h) and the engine's preparation of a load, so all cut the same ranges and
// fail alike.
#pragma once

#include <algorithm>
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "engine/layout.h"
#include "engine/ranks.h"
#include "optim/loss_scaler.h"

namespace strata::engine::detail {

// A run of a layer's flat buffer held in one of its state arrays: array index, position in
// the layer's padded flat buffer, elements.
struct Piece {
  std::size_t index, pos, len;
};

// What `rank` saves of layer li (its shard of every bucket, at every stage), or, with
// `whole`, the whole padded layer as a full array holds it.
std::vector<Piece> pieces(const Layout& lay, int stage, int rank, int li, bool whole);

// Calls fn(param index, first element in the param, array index, count) for each part of
// the piece `pc` that holds a parameter (padding between and after parameters is skipped).
template <class Fn> void for_each_param_range(const Layout& lay, const LayerLayout& L, const Piece& pc, Fn&& fn) {
  for (int pi : L.params) {
    const auto& p = lay.params()[pi];
    const std::size_t lo = std::max(pc.pos, p.offset), hi = std::min(pc.pos + pc.len, p.offset + p.numel);
    if (lo < hi) fn(pi, lo - p.offset, pc.index + (lo - pc.pos), hi - lo);
  }
}

// Collective: every rank's outcome of its part of an operation; the lowest failing rank, or
// -1 when every rank succeeded.
int first_failure(const Ranks& r, bool ok);

// Collective: runs fn; if it failed on any rank, every rank runs on_failure and throws (its
// own error, or one naming `what` and the failing rank).
void all_or_nothing(const Ranks& r, const std::function<void()>& fn, const std::string& what,
                    const std::function<void()>& on_failure = {});

// How a run scales its loss, as its checkpoints record it: "none", "static" or "dynamic".
inline const char* scaling_name(const optim::LossScalerConfig& c, bool fp16) {
  if (!fp16) return "none";
  return c.dynamic ? "dynamic" : "static";
}

}  // namespace strata::engine::detail
