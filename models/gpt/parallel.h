// The host kernels' parallel loops (models/gpt/ops.cc, models/llama/ops.cc): rows split into
// fixed blocks of kRowBlock, reductions across rows summed per block in row order and then
// the blocks in block order, so no result depends on how TBB schedules the blocks or on the
// thread count; and their xsimd batches (Lanes, for_lanes, sum_lanes, for_batches), whose
// last partial batch runs the same arithmetic on padded lanes.
#pragma once

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <vector>
#include <xsimd/xsimd.hpp>

namespace strata::model::ops {

inline constexpr int kRowBlock = 32;

template <class F> inline void for_rows(int N, F&& f) {
  tbb::parallel_for(
      tbb::blocked_range<int>(0, N, kRowBlock),
      [&](const tbb::blocked_range<int>& r) {
        for (int n = r.begin(); n < r.end(); ++n) f(n);
      },
      tbb::simple_partitioner());
}

// acc[k][c] += sum over rows n of contribution(n) into k outputs of C columns: each block of
// kRowBlock rows sums into its own partial, then partials are added in block order.
template <class F> inline void reduce_rows(int N, int C, int outputs, float* const* acc, F&& row_fn) {
  const int blocks = (N + kRowBlock - 1) / kRowBlock;
  const std::size_t stride = static_cast<std::size_t>(outputs) * static_cast<std::size_t>(C);
  std::vector<float> partial(static_cast<std::size_t>(blocks) * stride, 0.0f);
  tbb::parallel_for(
      0, blocks,
      [&](int b) {
        float* p = partial.data() + static_cast<std::size_t>(b) * stride;
        for (int n = b * kRowBlock; n < std::min(N, (b + 1) * kRowBlock); ++n) row_fn(n, p);
      },
      tbb::simple_partitioner());
  for (int b = 0; b < blocks; ++b) {
    const float* p = partial.data() + static_cast<std::size_t>(b) * stride;
    for (int k = 0; k < outputs; ++k) {
      if (acc[k] == nullptr) continue;
      for (int c = 0; c < C; ++c) acc[k][c] += p[static_cast<std::size_t>(k) * C + c];
    }
  }
}

template <class F> inline void for_elems(std::size_t n, F&& f) {
  constexpr std::size_t kGrain = 1 << 14;
  tbb::parallel_for(
      tbb::blocked_range<std::size_t>(0, n, kGrain),
      [&](const tbb::blocked_range<std::size_t>& r) {
        for (std::size_t i = r.begin(); i < r.end(); ++i) f(i);
      },
      tbb::simple_partitioner());
}

using FloatBatch = xsimd::batch<float>;

// One batch of lanes [i, i + len) of for_batches' elements: load() and store() move a whole
// batch, or, for the last len < FloatBatch::size lanes, go through a zero-padded copy, so the
// tail runs the same batch arithmetic as every other element.
struct Lanes {
  std::size_t i, len;
  FloatBatch load(const float* base) const {
    if (len == FloatBatch::size) return FloatBatch::load_unaligned(base + i);
    alignas(64) float pad[FloatBatch::size] = {};
    std::memcpy(pad, base + i, len * sizeof(float));
    return FloatBatch::load_aligned(pad);
  }
  // v with its padded lanes (from len on) replaced by zeros, for sums over the valid ones.
  // Selected, not multiplied by 0: a padded lane may hold inf (exp of a shifted zero), and
  // inf * 0 is NaN.
  FloatBatch valid_only(const FloatBatch& v) const {
    if (len == FloatBatch::size) return v;
    alignas(64) float index[FloatBatch::size];
    for (std::size_t k = 0; k < FloatBatch::size; ++k) index[k] = static_cast<float>(k);
    return xsimd::select(FloatBatch::load_aligned(index) < static_cast<float>(len), v, FloatBatch(0.0f));
  }
  void store(float* base, const FloatBatch& v) const {
    if (len == FloatBatch::size) return v.store_unaligned(base + i);
    alignas(64) float pad[FloatBatch::size];
    v.store_aligned(pad);
    std::memcpy(base + i, pad, len * sizeof(float));
  }
};

// f(Lanes) over the n elements of one row in order, on the calling thread.
template <class F> inline void for_lanes(int n, F&& f) {
  constexpr int W = static_cast<int>(FloatBatch::size);
  for (int i = 0; i < n; i += W) f(Lanes{static_cast<std::size_t>(i), static_cast<std::size_t>(std::min(W, n - i))});
}

// The sum over one row's n elements of f(Lanes) (a batch; its padded lanes do not count): lane
// by lane in row order, then across the lanes, so a row's sum has fixed bits.
template <class F> inline float sum_lanes(int n, F&& f) {
  FloatBatch acc(0.0f);
  for_lanes(n, [&](const Lanes& l) { acc += l.valid_only(f(l)); });
  return xsimd::hadd(acc);
}

// f(Lanes) over n elements in xsimd batches, split over TBB in fixed blocks. For elementwise
// kernels whose arithmetic is lane by lane (xsimd's tanh and exp are), so an element's
// result depends on its value alone: the same bits at any thread count and block split.
template <class F> inline void for_batches(std::size_t n, F&& f) {
  constexpr std::size_t W = FloatBatch::size, kGrain = (std::size_t{1} << 14) / W;
  tbb::parallel_for(
      tbb::blocked_range<std::size_t>(0, (n + W - 1) / W, kGrain),
      [&](const tbb::blocked_range<std::size_t>& r) {
        for (std::size_t b = r.begin(); b < r.end(); ++b) f(Lanes{b * W, std::min(W, n - b * W)});
      },
      tbb::simple_partitioner());
}

}  // namespace strata::model::ops
