// Newton-Schulz orthogonalization and its deterministic product (see newton_schulz.h).
#include "optim/newton_schulz.h"

#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "optim/detail/simd_io.h"
#include "runtime/core/error.h"

namespace strata::optim {
namespace {

using detail::FB;
constexpr int kW = static_cast<int>(FB::size);
constexpr int kRows = 8;     // rows of C a tile holds in registers (16 accumulators)
constexpr int kChunk = 256;  // columns of C a task covers (whole vectors)

// C[R rows, V vectors] from A's rows (lda) and B's columns (ldb), k ascending, one fused
// multiply-add chain per element starting from +0. The pragmas unroll the loops over rows
// and vectors: left to GCC at -O2 the accumulators lived on the stack and the product ran at
// a third of the rate (70 against 180-300 GFLOP/s on 2 cores of an AMD EPYC).
template <int R, int V> void tile(int K, const float* A, int lda, const float* B, int ldb, float* C, int ldc) {
  FB acc[R][V];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) acc[r][v] = FB(0.0f);
  for (int k = 0; k < K; ++k) {
    FB b[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) b[v] = FB::load_unaligned(B + static_cast<std::size_t>(k) * ldb + v * kW);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const FB a(A[static_cast<std::size_t>(r) * lda + k]);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[r][v] = detail::fmadd(a, b[v], acc[r][v]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) acc[r][v].store_unaligned(C + static_cast<std::size_t>(r) * ldc + v * kW);
}

template <int R>
void row_block(int n0, int n1, int K, const float* A, int lda, const float* B, int ldb, float* C, int ldc) {
  int j = n0;
  for (; j + 2 * kW <= n1; j += 2 * kW) tile<R, 2>(K, A, lda, B + j, ldb, C + j, ldc);
  for (; j + kW <= n1; j += kW) tile<R, 1>(K, A, lda, B + j, ldb, C + j, ldc);
}

// The last N % kW columns: B's packed into `panel` (K x kW, zero-padded), C's through a buffer.
template <int R> void row_tail(int N, int K, const float* A, int lda, const float* panel, float* C, int ldc) {
  const int j = N - N % kW;
  float out[R * kW];
  tile<R, 1>(K, A, lda, panel, kW, out, kW);
  for (int r = 0; r < R; ++r)
    std::memcpy(C + static_cast<std::size_t>(r) * ldc + j, out + r * kW, sizeof(float) * (N - j));
}

// f(i) for i in [0, n), in parallel blocks (elementwise: the bits do not depend on them).
template <class F> void each(std::size_t n, F&& f) {
  constexpr std::size_t kBlock = 16384;
  tbb::parallel_for(std::size_t{0}, (n + kBlock - 1) / kBlock, [&](std::size_t b) {
    for (std::size_t i = b * kBlock; i < std::min(n, (b + 1) * kBlock); ++i) f(i);
  });
}

void transpose(const float* x, int rows, int cols, float* out) {
  constexpr int kB = 32;
  tbb::parallel_for(0, (rows + kB - 1) / kB, [&](int bi) {
    const int i0 = bi * kB, i1 = std::min(rows, i0 + kB);
    for (int j0 = 0; j0 < cols; j0 += kB) {
      const int j1 = std::min(cols, j0 + kB);
      for (int i = i0; i < i1; ++i)
        for (int j = j0; j < j1; ++j)
          out[static_cast<std::size_t>(j) * rows + i] = x[static_cast<std::size_t>(i) * cols + j];
    }
  });
}

}  // namespace

void deterministic_matmul(int M, int N, int K, const float* A, int lda, const float* B, int ldb, float* C, int ldc) {
  STRATA_CHECK(M >= 0 && N >= 0 && K >= 0 && lda >= K && ldb >= N && ldc >= N, Errc::invalid_argument,
               "deterministic_matmul: M ", M, ", N ", N, ", K ", K, " with lda ", lda, ", ldb ", ldb, ", ldc ", ldc);
  if (M == 0 || N == 0) return;
  std::vector<float> panel;
  if (N % kW != 0) {
    const int j = N - N % kW;
    panel.assign(static_cast<std::size_t>(K) * kW, 0.0f);
    for (int k = 0; k < K; ++k)
      std::memcpy(panel.data() + static_cast<std::size_t>(k) * kW, B + static_cast<std::size_t>(k) * ldb + j,
                  sizeof(float) * (N - j));
  }
  const int row_blocks = (M + kRows - 1) / kRows, chunks = (N + kChunk - 1) / kChunk;
  tbb::parallel_for(0, row_blocks * chunks, [&](int t) {
    const int i = (t / chunks) * kRows, n0 = (t % chunks) * kChunk, n1 = std::min(N, n0 + kChunk);
    const int whole = n1 - (n1 == N ? N % kW : 0);  // the chunk's columns in whole vectors
    const bool tail = n1 == N && N % kW != 0;
    for (int r = i; r < std::min(M, i + kRows);) {
      const float* a = A + static_cast<std::size_t>(r) * lda;
      float* c = C + static_cast<std::size_t>(r) * ldc;
      if (r + kRows <= M) {
        row_block<kRows>(n0, whole, K, a, lda, B, ldb, c, ldc);
        if (tail) row_tail<kRows>(N, K, a, lda, panel.data(), c, ldc);
        r += kRows;
      } else {
        row_block<1>(n0, whole, K, a, lda, B, ldb, c, ldc);
        if (tail) row_tail<1>(N, K, a, lda, panel.data(), c, ldc);
        r += 1;
      }
    }
  });
}

void newton_schulz(float* u, int rows, int cols, const NewtonSchulz& ns, std::vector<float>& scratch) {
  STRATA_CHECK(rows > 0 && cols > 0 && ns.steps >= 0 && ns.eps > 0, Errc::invalid_argument, "newton_schulz: a ", rows,
               " x ", cols, " matrix with ", ns.steps, " steps and eps ", ns.eps);
  const bool wide = rows <= cols;
  const int r = wide ? rows : cols, c = wide ? cols : rows;
  const std::size_t rc = static_cast<std::size_t>(r) * c;
  if (scratch.size() < rc) scratch.resize(rc);
  float* x = scratch.data();  // X, r x c
  double sq = 0;
  for (std::size_t i = 0; i < rc; ++i) sq += static_cast<double>(u[i]) * u[i];
  const float norm = std::max(static_cast<float>(std::sqrt(sq)), ns.eps);
  if (wide)
    std::memcpy(x, u, rc * sizeof(float));
  else
    transpose(u, rows, cols, x);
  each(rc, [&](std::size_t i) { x[i] /= norm; });
  std::vector<float> step;  // the iteration's products (r c + 2 r^2 floats)
  for (int s = 0; s < ns.steps; ++s) newton_schulz_iteration(x, r, c, ns, step);
  if (wide)
    std::memcpy(u, x, rc * sizeof(float));
  else
    transpose(x, r, c, u);
}

void newton_schulz_iteration(float* x, int r, int c, const NewtonSchulz& ns, std::vector<float>& scratch) {
  STRATA_CHECK(r > 0 && r <= c, Errc::invalid_argument, "newton_schulz_iteration: a ", r, " x ", c,
               " matrix (it takes r <= c)");
  const std::size_t rc = static_cast<std::size_t>(r) * c, rr = static_cast<std::size_t>(r) * r;
  if (scratch.size() < rc + 2 * rr) scratch.resize(rc + 2 * rr);
  float* t = scratch.data();  // X^T (c x r), then H X (r x c)
  float* g = t + rc;          // G = X X^T
  float* h = g + rr;          // G G, then H
  transpose(x, r, c, t);
  deterministic_matmul(r, r, c, x, c, t, r, g, r);
  deterministic_matmul(r, r, r, g, r, g, r, h, r);
  each(rr, [&](std::size_t i) { h[i] = ns.b * g[i] + ns.c * h[i]; });
  deterministic_matmul(r, c, r, h, r, x, c, t, c);
  each(rc, [&](std::size_t i) { x[i] = ns.a * x[i] + t[i]; });
}

double newton_schulz_flops(int rows, int cols, int steps) noexcept {
  const double r = std::min(rows, cols), c = std::max(rows, cols);
  return steps * (4.0 * r * r * c + 2.0 * r * r * r);
}

}  // namespace strata::optim
