// The deterministic gradient norm pass (see grad_norm.h for the summation order).
#include "optim/grad_norm.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "engine/core/error.h"
#include "optim/detail/dispatch.h"

namespace strata::optim {
namespace {

using detail::FB;
using detail::kLanes;
using DB = xsimd::batch<double>;
constexpr std::size_t kHalves = kLanes / DB::size;  // double batches per float batch
constexpr std::size_t kAccumulators = 4;
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

template <DType T>
struct BlockSum {
  // Sum of squares of elements [0, len) of `grad`, len <= kNormBlockElems.
  static double run(const void* grad, std::size_t len) noexcept {
    DB acc[kAccumulators] = {DB(0.0), DB(0.0), DB(0.0), DB(0.0)};
    std::size_t slot = 0;
    auto add = [&](const FB& x) {
      DB lo, hi;
      widen(x, lo, hi);
      acc[slot] = xsimd::fma(lo, lo, acc[slot]);
      acc[slot + 1] = xsimd::fma(hi, hi, acc[slot + 1]);
      slot = (slot + kHalves) % kAccumulators;
    };
    std::size_t i = 0;
    for (; i + kLanes <= len; i += kLanes) add(detail::load_lanes<T>(grad, i));
    if (i < len) {
      // Zero padding adds exact zeros: the order of the real elements is unchanged.
      alignas(64) unsigned char pad[kLanes * sizeof(float)] = {};
      const std::size_t eb = dtype_size(T);
      std::memcpy(pad, static_cast<const unsigned char*>(grad) + i * eb, (len - i) * eb);
      add(detail::load_lanes<T>(pad, 0));
    }
    const DB total = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    alignas(64) double lanes[DB::size];
    total.store_aligned(lanes);
    double sum = 0.0;
    for (std::size_t k = 0; k < DB::size; ++k) sum += lanes[k];
    return sum;
  }
};

template <DType T>
double sum_blocks(const void* grad, std::size_t n) {
  const std::size_t eb = dtype_size(T);
  const auto* base = static_cast<const unsigned char*>(grad);
  const std::size_t blocks = (n + kNormBlockElems - 1) / kNormBlockElems;
  auto block_sum = [&](std::size_t b) noexcept {
    const std::size_t begin = b * kNormBlockElems;
    return BlockSum<T>::run(base + begin * eb, std::min(kNormBlockElems, n - begin));
  };
  std::vector<double> partial(blocks);
  if (n < detail::kParallelMinElems) {
    for (std::size_t b = 0; b < blocks; ++b) partial[b] = block_sum(b);
  } else {
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, blocks, 16), [&](const tbb::blocked_range<std::size_t>& r) {
      for (std::size_t b = r.begin(); b != r.end(); ++b) partial[b] = block_sum(b);
    });
  }
  double sum = 0.0;
  for (double p : partial) sum += p;
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
