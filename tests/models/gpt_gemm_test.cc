// gemm() (models/gpt/gemm.h) against a double-precision product: every transpose combination,
// padded leading dimensions, beta 0 and 1, shapes split into row panels and into column
// panels. fp32: within gamma_{K+1} of the exact result relative to the sum of |terms|. bf16:
// the same bound against the exact product of the bf16-rounded inputs (a bf16 x bf16 product
// is exact in fp32, so only the fp32 sum rounds), and measurably away from the unrounded one
// (the inputs really were rounded). Both give the same bits with one thread and with all.
#include <tbb/global_control.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "models/gpt/gemm.h"
#include "runtime/core/dtype.h"
#include "runtime/core/random.h"

using namespace strata;
using model::ops::Products;

namespace {

struct Case {
  bool ta, tb;
  int M, N, K;
  float beta;
};

std::vector<float> values(std::size_t n, std::uint64_t key) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    v[i] = static_cast<float>(box_muller(splitmix64(key + 2 * i), splitmix64(key + 2 * i + 1)));
  }
  return v;
}

float round_bf16(float x) { return bf16_to_fp32(fp32_to_bf16(x)); }

struct Operands {
  int lda, ldb, ldc;
  std::vector<float> A, B, C0;
};

Operands operands(const Case& c) {
  Operands o;
  const int a_rows = c.ta ? c.K : c.M, a_cols = c.ta ? c.M : c.K;
  const int b_rows = c.tb ? c.N : c.K, b_cols = c.tb ? c.K : c.N;
  o.lda = a_cols + 3;
  o.ldb = b_cols + 5;
  o.ldc = c.N + 2;
  o.A = values(static_cast<std::size_t>(a_rows) * o.lda, 11);
  o.B = values(static_cast<std::size_t>(b_rows) * o.ldb, 12);
  o.C0 = values(static_cast<std::size_t>(c.M) * o.ldc, 13);
  return o;
}

// Exact (double) C = op(A) op(B) + beta C0, and the sum of |terms| of each element.
void reference(const Case& c, const Operands& o, bool bf16, std::vector<double>& exact, std::vector<double>& mag) {
  exact.assign(static_cast<std::size_t>(c.M) * c.N, 0.0);
  mag.assign(exact.size(), 0.0);
  auto r = [&](float x) { return static_cast<double>(bf16 ? round_bf16(x) : x); };
  for (int m = 0; m < c.M; ++m) {
    for (int n = 0; n < c.N; ++n) {
      const double c0 = c.beta * o.C0[static_cast<std::size_t>(m) * o.ldc + n];
      double s = c0, a_s = std::abs(c0);
      for (int k = 0; k < c.K; ++k) {
        const double a =
            r(c.ta ? o.A[static_cast<std::size_t>(k) * o.lda + m] : o.A[static_cast<std::size_t>(m) * o.lda + k]);
        const double b =
            r(c.tb ? o.B[static_cast<std::size_t>(n) * o.ldb + k] : o.B[static_cast<std::size_t>(k) * o.ldb + n]);
        s += a * b;
        a_s += std::abs(a * b);
      }
      exact[static_cast<std::size_t>(m) * c.N + n] = s;
      mag[static_cast<std::size_t>(m) * c.N + n] = a_s;
    }
  }
}

std::vector<float> run(const Case& c, const Operands& o, Products p) {
  std::vector<float> C = o.C0;
  model::ops::gemm(p, c.ta, c.tb, c.M, c.N, c.K, 1.0f, o.A.data(), o.lda, o.B.data(), o.ldb, c.beta, C.data(), o.ldc);
  return C;
}

double gamma_k(std::size_t K) {
  const double u = std::numeric_limits<float>::epsilon() / 2.0;
  return static_cast<double>(K) * u / (1.0 - static_cast<double>(K) * u);
}

// Largest |C - exact| / (gamma_{K+1} * sum|terms|) over the elements (<= 1: within the bound).
double worst_ratio(const Case& c, const Operands& o, const std::vector<float>& C, const std::vector<double>& exact,
                   const std::vector<double>& mag) {
  double worst = 0;
  for (int m = 0; m < c.M; ++m) {
    for (int n = 0; n < c.N; ++n) {
      const std::size_t i = static_cast<std::size_t>(m) * c.N + n;
      const double err = std::abs(C[static_cast<std::size_t>(m) * o.ldc + n] - exact[i]);
      worst = std::max(worst, err / (gamma_k(static_cast<std::size_t>(c.K) + 1) * mag[i]));
    }
  }
  return worst;
}

}  // namespace

TEST_CASE("gemm matches a double product in fp32 and in bf16, for every transpose and split", "[gpt][gemm]") {
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (float beta : {0.0f, 1.0f}) {
        // 150 rows: three row panels; 200 columns: four column panels.
        for (const Case c : {Case{ta, tb, 150, 70, 90, beta}, Case{ta, tb, 40, 200, 33, beta}}) {
          INFO("ta " << ta << " tb " << tb << " M " << c.M << " N " << c.N << " K " << c.K << " beta " << beta);
          const Operands o = operands(c);
          std::vector<double> exact, mag, exact16, mag16;
          reference(c, o, false, exact, mag);
          reference(c, o, true, exact16, mag16);
          const auto f32 = run(c, o, Products::fp32);
          CHECK(worst_ratio(c, o, f32, exact, mag) <= 1.0);
          const auto b16 = run(c, o, Products::bf16);
          if (model::ops::bf16_products_available()) {
            CHECK(worst_ratio(c, o, b16, exact16, mag16) <= 1.0);
            CHECK(worst_ratio(c, o, b16, exact, mag) > 10.0);  // the inputs were rounded to bf16
          } else {
            CHECK(b16 == f32);  // falls back to fp32
          }
          // Rows of C outside op's M x N (the padding) are untouched.
          for (int m = 0; m < c.M; ++m) {
            for (int n = c.N; n < o.ldc; ++n) {
              const std::size_t i = static_cast<std::size_t>(m) * o.ldc + n;
              CHECK(f32[i] == o.C0[i]);
              CHECK(b16[i] == o.C0[i]);
            }
          }
          tbb::global_control one(tbb::global_control::max_allowed_parallelism, 1);
          CHECK(run(c, o, Products::fp32) == f32);
          CHECK(run(c, o, Products::bf16) == b16);
        }
      }
    }
  }
}

TEST_CASE("gemm with an empty product writes beta C, and an empty C nothing", "[gpt][gemm]") {
  for (Products p : {Products::fp32, Products::bf16}) {
    std::vector<float> c = {1.0f, 2.0f, 3.0f, 4.0f};
    model::ops::gemm(p, false, false, 2, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 1.0f, c.data(), 2);
    CHECK(c == std::vector<float>{1.0f, 2.0f, 3.0f, 4.0f});
    model::ops::gemm(p, false, false, 2, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 0.0f, c.data(), 2);
    CHECK(c == std::vector<float>{0.0f, 0.0f, 0.0f, 0.0f});
    model::ops::gemm(p, false, false, 0, 2, 3, 1.0f, nullptr, 3, nullptr, 2, 0.0f, nullptr, 2);
  }
}

TEST_CASE("bf16 products refuse alpha other than 1 and beta other than 0 or 1", "[gpt][gemm]") {
  if (!model::ops::bf16_products_available()) return;
  std::vector<float> a(16, 1.0f), b(16, 1.0f), c(16, 0.0f);
  CHECK_THROWS_WITH(
      model::ops::gemm(Products::bf16, false, false, 4, 4, 4, 2.0f, a.data(), 4, b.data(), 4, 0.0f, c.data(), 4),
      Catch::Contains("bf16 products take alpha 1 and beta 0 or 1"));
}
