// The deterministic gradient norm pass (see grad_norm.h for the summation order).
#include "optim/grad_norm.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "optim/detail/dispatch.h"
#include "runtime/core/error.h"

namespace strata::optim {
namespace {

using detail::FB;
using detail::kLanes;
using DB = xsimd::batch<double>;
constexpr std::size_t kHalves = kLanes / DB::size;  // double batches per float batch
static_assert(kHalves == 2, "a float batch widens to two double batches");
static_assert(kNormBlockElems % kLanes == 0, "norm blocks hold whole batches");

inline void widen(const FB& x, DB& lo, DB& hi) noexcept {
#if XSIMD_WITH_AVX512F
  lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
  hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
#elif XSIMD_WITH_AVX
  lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
  hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
#elif XSIMD_WITH_SSE2
  lo = _mm_cvtps_pd(x);
  hi = _mm_cvtps_pd(_mm_movehl_ps(x, x));
#else
  alignas(64) float f[kLanes];
  alignas(64) double d[kLanes];
  x.store_aligned(f);
  for (std::size_t k = 0; k < kLanes; ++k) d[k] = f[k];
  lo = DB::load_aligned(d);
  hi = DB::load_aligned(d + DB::size);
#endif
}

// Batch b of a block feeds accumulators 2(b mod 2) and 2(b mod 2) + 1 (even batches a0 and
// a1, odd ones a2 and a3); the zero-padded tail batch continues the pattern. Named members,
// not an indexed array, so they stay in registers.
struct Acc {
  DB a0 = DB(0.0), a1 = DB(0.0), a2 = DB(0.0), a3 = DB(0.0);
};

inline void add(const FB& x, DB& lo_acc, DB& hi_acc) noexcept {
  DB lo, hi;
  widen(x, lo, hi);
  lo_acc = xsimd::fma(lo, lo, lo_acc);  // exact square: fma and mul + add agree
  hi_acc = xsimd::fma(hi, hi, hi_acc);
}

template <DType T> inline void add_pair(const void* grad, std::size_t i, Acc& a) noexcept {
  add(detail::load_lanes<T>(grad, i), a.a0, a.a1);
  add(detail::load_lanes<T>(grad, i + kLanes), a.a2, a.a3);
}

// Finishes a block whose pairs of batches before element i are in `a`: the odd batch, the
// padded tail, then the fixed-order reduction.
template <DType T> double finish(const void* grad, std::size_t i, std::size_t len, Acc& a) noexcept {
  bool odd = false;
  if (i + kLanes <= len) {
    add(detail::load_lanes<T>(grad, i), a.a0, a.a1);
    i += kLanes;
    odd = true;
  }
  if (i < len) {
    // Zero padding adds exact zeros: the order of the real elements is unchanged.
    alignas(64) unsigned char pad[kLanes * sizeof(float)] = {};
    const std::size_t eb = dtype_size(T);
    std::memcpy(pad, static_cast<const unsigned char*>(grad) + i * eb, (len - i) * eb);
    if (odd)
      add(detail::load_lanes<T>(pad, 0), a.a2, a.a3);
    else
      add(detail::load_lanes<T>(pad, 0), a.a0, a.a1);
  }
  const DB total = (a.a0 + a.a1) + (a.a2 + a.a3);
  alignas(64) double lanes[DB::size];
  total.store_aligned(lanes);
  double sum = 0.0;
  for (std::size_t k = 0; k < DB::size; ++k) sum += lanes[k];
  return sum;
}

// Sum of squares of elements [0, len) of one block, len <= kNormBlockElems.
template <DType T> double block_sum(const void* grad, std::size_t len) noexcept {
  Acc a;
  std::size_t i = 0;
  for (; i + 2 * kLanes <= len; i += 2 * kLanes) add_pair<T>(grad, i, a);
  return finish<T>(grad, i, len, a);
}

// kWays full blocks summed side by side: one core keeps several memory streams in flight
// (a lone read stream is latency-bound), while each block's own order is block_sum's.
constexpr std::size_t kWays = 4;
static_assert(kNormBlockElems % (2 * kLanes) == 0, "full blocks hold whole pairs of batches");

template <DType T, std::size_t... K>
void full_blocks_sum(const unsigned char* first, double* out, std::index_sequence<K...>) noexcept {
  const std::size_t block_bytes = kNormBlockElems * dtype_size(T);
  Acc acc[sizeof...(K)];
  for (std::size_t i = 0; i < kNormBlockElems; i += 2 * kLanes) (add_pair<T>(first + K * block_bytes, i, acc[K]), ...);
  ((out[K] = finish<T>(first + K * block_bytes, kNormBlockElems, kNormBlockElems, acc[K])), ...);
}

template <DType T> double sum_blocks(const void* grad, std::size_t n) {
  const std::size_t eb = dtype_size(T);
  const auto* base = static_cast<const unsigned char*>(grad);
  const std::size_t blocks = (n + kNormBlockElems - 1) / kNormBlockElems;
  const std::size_t full = n / kNormBlockElems;
  std::vector<double> partial(blocks);
  auto range_sum = [&](std::size_t b, std::size_t end) noexcept {
    for (; b + kWays <= std::min(end, full); b += kWays) {
      full_blocks_sum<T>(base + b * kNormBlockElems * eb, &partial[b], std::make_index_sequence<kWays>{});
    }
    for (; b < end; ++b) {
      const std::size_t begin = b * kNormBlockElems;
      partial[b] = block_sum<T>(base + begin * eb, std::min(kNormBlockElems, n - begin));
    }
  };
  if (n < detail::kParallelMinElems) {
    range_sum(0, blocks);
  } else {
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, blocks, 16),
                      [&](const tbb::blocked_range<std::size_t>& r) { range_sum(r.begin(), r.end()); });
  }
  double sum = 0.0;
  for (double p : partial) sum += p;  // block order, whoever computed each block
  return sum;
}

}  // namespace

GradNorm grad_norm_sq(const void* grad, DType dtype, std::size_t n) {
  STRATA_CHECK(dtype == DType::fp32 || dtype == DType::bf16 || dtype == DType::fp16, Errc::invalid_argument,
               "grad_norm_sq: dtype ", dtype_name(dtype), " is not supported: use fp32, bf16 or fp16");
  GradNorm out;
  if (n == 0) return out;
  STRATA_CHECK(grad, Errc::invalid_argument, "grad_norm_sq: grad is null for ", n, " elements");
  double sum = 0.0;
  detail::with_grad_dtype(dtype, [&](auto t) { sum = sum_blocks<decltype(t)::value>(grad, n); });
  out.sumsq = sum;
  out.finite = std::isfinite(sum);
  return out;
}

}  // namespace strata::optim
