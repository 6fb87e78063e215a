// Muon's pieces against references: the deterministic product bit for bit against one fused
// multiply-add chain per element, at any thread count; each Newton-Schulz iteration within an
// elementwise bound derived from the rounding of its fp32 operations (a double reference on
// the same input); the whole orthogonalization as its iterations composed, and its result's
// singular values where the coefficients put them; a Muon step as momentum, orthogonalization
// and update composed, against a double reference of the elementwise parts.
#include <tbb/task_arena.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "optim/muon.h"
#include "optim/newton_schulz.h"
#include "runtime/core/error.h"
#include "tests/support/same_bits.h"

using namespace strata;
using strata::test::same_bits;

namespace {

std::vector<float> randn(std::size_t n, unsigned seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// The definition: element (i, j) is acc = fma(A[i,k], B[k,j], acc) for k ascending from +0
// (two roundings where the build has no FMA, as the kernel).
float chain(const float* a, const float* b, int K, int ldb) {
  float acc = 0.0f;
  for (int k = 0; k < K; ++k) {
#if defined(__FMA__)
    acc = std::fma(a[k], b[static_cast<std::size_t>(k) * ldb], acc);
#else
    acc = a[k] * b[static_cast<std::size_t>(k) * ldb] + acc;
#endif
  }
  return acc;
}

using Mat = std::vector<double>;

// r x c times c x n, all double.
Mat mul(const Mat& a, const Mat& b, int r, int k, int n) {
  Mat out(static_cast<std::size_t>(r) * n, 0.0);
  for (int i = 0; i < r; ++i)
    for (int q = 0; q < k; ++q)
      for (int j = 0; j < n; ++j) out[i * n + j] += a[i * k + q] * b[q * n + j];
  return out;
}
Mat transpose(const Mat& a, int r, int c) {
  Mat t(a.size());
  for (int i = 0; i < r; ++i)
    for (int j = 0; j < c; ++j) t[j * r + i] = a[i * c + j];
  return t;
}
Mat abs_of(Mat a) {
  for (auto& x : a) x = std::fabs(x);
  return a;
}
Mat add(Mat a, const Mat& b, double s = 1.0) {
  for (std::size_t i = 0; i < a.size(); ++i) a[i] += s * b[i];
  return a;
}

}  // namespace

TEST_CASE("the deterministic product is one fused multiply-add chain per element, at any thread count",
          "[optim][muon]") {
  const int M = GENERATE(1, 7, 33), N = GENERATE(5, 37, 300), K = GENERATE(1, 19, 70);
  CAPTURE(M, N, K);
  const int lda = K + 3, ldb = N + 1, ldc = N + 2;
  const auto A = randn(static_cast<std::size_t>(M) * lda, 1), B = randn(static_cast<std::size_t>(K) * ldb, 2);
  std::vector<float> C(static_cast<std::size_t>(M) * ldc, -7.0f), want = C;
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) want[i * ldc + j] = chain(A.data() + i * lda, B.data() + j, K, ldb);
  optim::deterministic_matmul(M, N, K, A.data(), lda, B.data(), ldb, C.data(), ldc);
  CHECK(same_bits(C, want));  // the padding columns of C untouched as well
  std::vector<float> one(C.size(), -7.0f);
  tbb::task_arena(1).execute(
      [&] { optim::deterministic_matmul(M, N, K, A.data(), lda, B.data(), ldb, one.data(), ldc); });
  CHECK(same_bits(one, C));
}

TEST_CASE("each Newton-Schulz iteration lies within the bound its fp32 rounding allows", "[optim][muon]") {
  const int r = GENERATE(1, 9, 24), c = GENERATE(24, 61);
  CAPTURE(r, c);
  const optim::NewtonSchulz ns;
  const double u = std::ldexp(1.0, -24);
  const auto gamma = [u](int n) { return n * u / (1 - n * u); };
  // A normalized start, then five iterations, each checked on the fp32 input it was given.
  auto x = randn(static_cast<std::size_t>(r) * c, 3);
  double sq = 0;
  for (float v : x) sq += static_cast<double>(v) * v;
  for (auto& v : x) v = static_cast<float>(v / std::sqrt(sq));
  std::vector<float> scratch;
  for (int step = 0; step < ns.steps; ++step) {
    CAPTURE(step);
    const Mat X(x.begin(), x.end()), aX = abs_of(X);
    const Mat Xt = transpose(X, r, c), aXt = transpose(aX, r, c);
    // Exact (double) values of the iteration on this input, and bounds on the fp32 errors:
    // a dot product of length n with fused multiply-adds is off by at most gamma(n) times the
    // sum of its terms' magnitudes; each operand error adds its product with the other side.
    const Mat G = mul(X, Xt, r, c, r), aG = abs_of(G);
    const Mat eG = [&] {
      Mat e = mul(aX, aXt, r, c, r);
      for (auto& v : e) v *= gamma(c);
      return e;
    }();
    const Mat GG = mul(G, G, r, r, r), aGhat = add(aG, eG);
    const Mat eGG = add(add(mul(eG, aG, r, r, r), mul(aG, eG, r, r, r)), mul(eG, eG, r, r, r));
    Mat eGG_total = mul(aGhat, aGhat, r, r, r);
    for (std::size_t i = 0; i < eGG_total.size(); ++i) eGG_total[i] = gamma(r) * eGG_total[i] + eGG[i];
    const double b = ns.b, cc = ns.c, a = ns.a;
    Mat H(G.size()), eH(G.size());
    for (std::size_t i = 0; i < G.size(); ++i) {
      H[i] = b * G[i] + cc * GG[i];
      // b g and c gg each rounded, then their sum: three roundings of at most u each.
      const double mag = std::fabs(b) * (aG[i] + eG[i]) + std::fabs(cc) * (std::fabs(GG[i]) + eGG_total[i]);
      eH[i] = std::fabs(b) * eG[i] + std::fabs(cc) * eGG_total[i] + 3 * u * mag;
    }
    const Mat HX = mul(H, X, r, r, c), aHhat = add(abs_of(H), eH);
    Mat eHX = mul(aHhat, aX, r, r, c);
    const Mat eHX_ops = mul(eH, aX, r, r, c);
    for (std::size_t i = 0; i < eHX.size(); ++i) eHX[i] = gamma(r) * eHX[i] + eHX_ops[i];
    std::vector<float> got = x;
    optim::newton_schulz_iteration(got.data(), r, c, ns, scratch);
    for (std::size_t i = 0; i < got.size(); ++i) {
      const double want = a * X[i] + HX[i];
      const double bound = eHX[i] + 3 * u * (std::fabs(a * X[i]) + std::fabs(HX[i]) + eHX[i]);
      if (std::fabs(got[i] - want) > bound) {
        CAPTURE(i, got[i], want, bound);
        FAIL("outside the derived bound");
      }
    }
    x = got;
  }
}

TEST_CASE("the orthogonalization is its iterations composed, and moves singular values near 1", "[optim][muon]") {
  const int rows = GENERATE(40, 96), cols = GENERATE(64, 96);
  CAPTURE(rows, cols);
  // A gradient-like matrix: one strong direction (about 10 times the largest other singular
  // value) over noise.
  auto m = randn(static_cast<std::size_t>(rows) * cols, 4);
  const auto left = randn(rows, 5), right = randn(cols, 6);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) m[i * cols + j] += 3.0f * left[i] * right[j];
  auto o = m;
  std::vector<float> scratch;
  optim::newton_schulz(o.data(), rows, cols, {}, scratch);
  // Composed: normalize (transposed when tall), five iterations, transpose back.
  const bool wide = rows <= cols;
  const int r = wide ? rows : cols, c = wide ? cols : rows;
  std::vector<float> x(m.size());
  double sq = 0;
  for (float v : m) sq += static_cast<double>(v) * v;
  const float norm = static_cast<float>(std::sqrt(sq));
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) x[wide ? i * cols + j : j * rows + i] = m[i * cols + j] / norm;
  std::vector<float> s2;
  for (int s = 0; s < 5; ++s) optim::newton_schulz_iteration(x.data(), r, c, {}, s2);
  std::vector<float> back(m.size());
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) back[i * cols + j] = x[wide ? i * cols + j : j * rows + i];
  CHECK(same_bits(o, back));
  // Singular values: the eigenvalues of O O^T (r x r) lie within [0.1, 1.5] squared... checked
  // through its trace and its largest eigenvalue (power iteration): on average near 1 and
  // none far above (the quintic's fixed band is about 0.7-1.2; noise directions of a few
  // steps start lower).
  const Mat O(back.begin(), back.end());
  const Mat OOt =
      wide ? mul(O, transpose(O, rows, cols), rows, cols, rows) : mul(transpose(O, rows, cols), O, cols, rows, cols);
  double trace = 0;
  for (int i = 0; i < r; ++i) trace += OOt[i * r + i];
  CHECK(trace / r > 0.5);
  CHECK(trace / r < 1.3);
  Mat v(r, 1.0);
  double top = 0;
  for (int it = 0; it < 200; ++it) {
    Mat w = mul(OOt, v, r, r, 1);
    double n2 = 0;
    for (double q : w) n2 += q * q;
    top = std::sqrt(n2);
    for (int i = 0; i < r; ++i) v[i] = w[i] / top;
  }
  CHECK(std::sqrt(top) < 1.25);
  CHECK(std::sqrt(top) > 0.6);
}

TEST_CASE("a Muon step is momentum, orthogonalization and update, and checks its arguments", "[optim][muon]") {
  const int rows = 48, cols = 20;
  const std::size_t n = static_cast<std::size_t>(rows) * cols;
  const bool nesterov = GENERATE(true, false);
  const auto adjust = GENERATE(optim::MuonLrAdjust::original, optim::MuonLrAdjust::match_rms_adamw);
  CAPTURE(nesterov, static_cast<int>(adjust));
  optim::MuonConfig cfg;
  cfg.lr = 0.02f;
  cfg.nesterov = nesterov;
  cfg.adjust = adjust;
  auto w = randn(n, 7, 0.1f), m = randn(n, 8, 0.01f);
  const auto g = randn(n, 9, 0.05f);
  std::vector<std::uint16_t> copy(n);
  optim::StepArgs a;
  a.master = w.data();
  a.grad = g.data();
  a.m = m.data();
  a.n = n;
  a.grad_scale = 0.5f;
  a.copy = copy.data();
  // The reference: the elementwise parts in double from the same inputs, the orthogonalization
  // by the function the previous cases hold to its bounds.
  const double lerp = 1.0f - 0.95f;  // the kernel's weight, 1 - momentum in fp32
  const auto m0 = m;
  std::vector<double> m_ref(n);
  std::vector<float> upd(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double gi = 0.5 * g[i];
    m_ref[i] = m[i] + lerp * (gi - m[i]);
    upd[i] = static_cast<float>(nesterov ? m_ref[i] - lerp * (m_ref[i] - gi) : m_ref[i]);
  }
  std::vector<float> s;
  optim::newton_schulz(upd.data(), rows, cols, cfg.ns, s);
  const double lr =
      adjust == optim::MuonLrAdjust::original ? 0.02 * std::sqrt(48.0 / 20.0) : 0.02 * 0.2 * std::sqrt(48.0);
  CHECK(optim::muon_adjusted_lr(cfg, rows, cols) == Approx(lr).epsilon(1e-6));
  const auto w0 = w;
  optim::MuonScratch scratch;
  optim::muon_step(cfg, a, rows, cols, scratch);
  const double u = std::ldexp(1.0, -24);
  for (std::size_t i = 0; i < n; ++i) {
    // Three roundings (a difference, a product, a sum) of terms no larger than |m0| + |g|.
    CHECK(std::fabs(m[i] - m_ref[i]) <= 3 * u * (std::fabs(m0[i]) + std::fabs(0.5 * g[i])) * 1.01);
    // The update through the orthogonalization: its input is within a few roundings of upd's,
    // so the comparison allows the orthogonalization's own spread (relative 1e-4 of the
    // largest element), not bit equality.
    const double want = w0[i] * (1 - 0.02 * cfg.weight_decay) - lr * upd[i];
    CHECK(std::fabs(w[i] - want) <= 1e-4 * lr + 4 * u * std::fabs(want));
    CHECK(copy[i] == fp32_to_bf16(w[i]));
  }
  // Arguments name what is wrong.
  cfg.momentum = 1.0f;
  CHECK_THROWS_WITH(optim::muon_step(cfg, a, rows, cols, scratch), Catch::Contains("momentum = 1"));
  cfg.momentum = 0.95f;
  CHECK_THROWS_WITH(optim::muon_step(cfg, a, rows, cols + 1, scratch), Catch::Contains("48 x 21 matrix of 960"));
}
