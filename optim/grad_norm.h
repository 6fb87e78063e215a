// The read-only pass before a step: the squared L2 norm of a gradient shard and whether every
// element is finite (the overflow check of dynamic loss scaling). Deterministic: the same
// shard gives the same bits for any thread count, so the global norm is reproducible.
#pragma once

#include <cstddef>

#include "runtime/core/dtype.h"

namespace strata::optim {

struct GradNorm {
  double sumsq = 0.0;  // sum of squares (inf or NaN when an element is not finite)
  bool finite = true;  // every element finite
};

// Accumulate shards' results in a fixed order (shard index, then rank) to keep the global
// norm reproducible; addition of doubles is not associative.
inline GradNorm& operator+=(GradNorm& a, const GradNorm& b) noexcept {
  a.sumsq += b.sumsq;
  a.finite = a.finite && b.finite;
  return a;
}

// Fixed summation order. The shard is cut into blocks of kNormBlockElems elements counted
// from its first element (the last may be short). Within a block, squares are formed in
// double (exact: a float's square has at most 48 significant bits, and no finite float's
// square overflows a double) and accumulated lane by lane in batch order into four vector
// accumulators (even batches into two, odd batches into the other two), which are then
// combined in a fixed order. Block partials are added in block
// index order. TBB decides only who computes a block, never the order of any addition; the
// result depends on the build's vector width, not on threads or scheduling.
inline constexpr std::size_t kNormBlockElems = 4096;

// grad: fp32, bf16 or fp16 (host memory). Throws Errc::invalid_argument otherwise.
GradNorm grad_norm_sq(const void* grad, DType dtype, std::size_t n);

}  // namespace strata::optim
