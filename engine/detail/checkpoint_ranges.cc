// Ranges and collective outcomes of saves and loads (checkpoint_ranges.h).
#include "engine/detail/checkpoint_ranges.h"

#include <exception>

#include "runtime/core/error.h"

namespace strata::engine::detail {

std::vector<Piece> pieces(const Layout& lay, int stage, int rank, int li, bool whole) {
  const auto& L = lay.layers()[li];
  std::vector<Piece> out;
  for (std::size_t k = 0; k < L.buckets.size(); ++k) {
    const auto& b = lay.buckets()[L.buckets[k]];
    const std::size_t pos = b.flat_offset - L.flat_offset;
    const std::size_t own = static_cast<std::size_t>(rank) * b.shard;
    if (whole)
      out.push_back({pos, pos, b.padded});
    else
      out.push_back({stage == 0 ? pos + own : L.shard_offsets[k], pos + own, b.shard});
  }
  return out;
}

int first_failure(const Ranks& r, bool ok) {
  if (r.comm == nullptr || r.world == 1) return ok ? -1 : r.rank;
  const float mine = ok ? 0.0f : 1.0f;
  std::vector<float> all(static_cast<std::size_t>(r.world));
  r.comm->all_gather(&mine, all.data(), 1, DType::fp32);
  for (int k = 0; k < r.world; ++k)
    if (all[static_cast<std::size_t>(k)] != 0.0f) return k;
  return -1;
}

void all_or_nothing(const Ranks& r, const std::function<void()>& fn, const std::string& what,
                    const std::function<void()>& on_failure) {
  std::exception_ptr err;
  try {
    fn();
  } catch (...) {
    err = std::current_exception();
  }
  const int bad = first_failure(r, !err);
  if (bad < 0) return;
  if (on_failure) on_failure();
  if (err) std::rethrow_exception(err);
  STRATA_THROW(Errc::comm, "rank ", r.rank, ": ", what, " failed on rank ", bad, " (its error says why)");
}

}  // namespace strata::engine::detail
