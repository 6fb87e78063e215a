// gemm() (models/gpt/gemm.h) against a double-precision product: every transpose combination,
// padded leading dimensions, alpha 1 and not, beta 0 and 1, shapes split into row panels and
// into column panels. fp32: within gamma_{K+2} of the exact result relative to the sum of
// |terms|. bf16 and fp16: the same bound against the exact product of the inputs rounded to
// that format (a product of two such values is exact in fp32, so only the fp32 sums round),
// and measurably away from the unrounded one (the inputs really were rounded). Every
// precision gives the same bits with one thread and with all.
#include <tbb/global_control.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <thread>
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
  float alpha, beta;
};

std::vector<float> values(std::size_t n, std::uint64_t key) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    v[i] = static_cast<float>(box_muller(splitmix64(key + 2 * i), splitmix64(key + 2 * i + 1)));
  }
  return v;
}

float round_to(Products p, float x) {
  switch (p) {
    case Products::bf16:
      return bf16_to_fp32(fp32_to_bf16(x));
    case Products::fp16:
      return fp16_to_fp32(fp32_to_fp16(x));
    case Products::fp32:
      break;
  }
  return x;
}

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

// Exact (double) C = alpha op(A) op(B) + beta C0 with A and B rounded as p rounds them, and
// the sum of |terms| of each element.
void reference(const Case& c, const Operands& o, Products p, std::vector<double>& exact, std::vector<double>& mag) {
  exact.assign(static_cast<std::size_t>(c.M) * c.N, 0.0);
  mag.assign(exact.size(), 0.0);
  auto r = [&](float x) { return static_cast<double>(round_to(p, x)); };
  for (int m = 0; m < c.M; ++m) {
    for (int n = 0; n < c.N; ++n) {
      const double c0 = c.beta * o.C0[static_cast<std::size_t>(m) * o.ldc + n];
      double s = 0, a_s = 0;
      for (int k = 0; k < c.K; ++k) {
        const double a =
            r(c.ta ? o.A[static_cast<std::size_t>(k) * o.lda + m] : o.A[static_cast<std::size_t>(m) * o.lda + k]);
        const double b =
            r(c.tb ? o.B[static_cast<std::size_t>(n) * o.ldb + k] : o.B[static_cast<std::size_t>(k) * o.ldb + n]);
        s += a * b;
        a_s += std::abs(a * b);
      }
      s = c.alpha * s + c0;
      a_s = std::abs(c.alpha) * a_s + std::abs(c0);
      exact[static_cast<std::size_t>(m) * c.N + n] = s;
      mag[static_cast<std::size_t>(m) * c.N + n] = a_s;
    }
  }
}

std::vector<float> run(const Case& c, const Operands& o, Products p) {
  std::vector<float> C = o.C0;
  model::ops::gemm(p, c.ta, c.tb, c.M, c.N, c.K, c.alpha, o.A.data(), o.lda, o.B.data(), o.ldb, c.beta, C.data(),
                   o.ldc);
  return C;
}

double gamma_k(std::size_t K) {
  const double u = std::numeric_limits<float>::epsilon() / 2.0;
  return static_cast<double>(K) * u / (1.0 - static_cast<double>(K) * u);
}

// Largest |C - exact| / (gamma_{K+2} * sum|terms|) over the elements (<= 1: within the bound).
double worst_ratio(const Case& c, const Operands& o, const std::vector<float>& C, const std::vector<double>& exact,
                   const std::vector<double>& mag) {
  double worst = 0;
  for (int m = 0; m < c.M; ++m) {
    for (int n = 0; n < c.N; ++n) {
      const std::size_t i = static_cast<std::size_t>(m) * c.N + n;
      const double err = std::abs(C[static_cast<std::size_t>(m) * o.ldc + n] - exact[i]);
      worst = std::max(worst, err / (gamma_k(static_cast<std::size_t>(c.K) + 2) * mag[i]));
    }
  }
  return worst;
}

}  // namespace

TEST_CASE("gemm matches a double product in fp32, bf16 and fp16, for every transpose and split", "[gpt][gemm]") {
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (float alpha : {1.0f, 0.3f}) {
        for (float beta : {0.0f, 1.0f}) {
          // 150 rows: three row panels; 200 columns: four column panels.
          for (const Case c : {Case{ta, tb, 150, 70, 90, alpha, beta}, Case{ta, tb, 40, 200, 33, alpha, beta}}) {
            INFO("ta " << ta << " tb " << tb << " M " << c.M << " N " << c.N << " K " << c.K << " alpha " << alpha
                       << " beta " << beta);
            const Operands o = operands(c);
            std::vector<double> exact, mag;
            reference(c, o, Products::fp32, exact, mag);
            const auto f32 = run(c, o, Products::fp32);
            CHECK(worst_ratio(c, o, f32, exact, mag) <= 1.0);
            for (Products p : {Products::bf16, Products::fp16}) {
              INFO((p == Products::bf16 ? "bf16" : "fp16"));
              std::vector<double> exact_r, mag_r;
              reference(c, o, p, exact_r, mag_r);
              const auto got = run(c, o, p);
              if (p == Products::bf16 && !model::ops::bf16_products_available()) {
                CHECK(got == f32);  // falls back to fp32
              } else {
                CHECK(worst_ratio(c, o, got, exact_r, mag_r) <= 1.0);
                CHECK(worst_ratio(c, o, got, exact, mag) > 10.0);  // the inputs were rounded
              }
              // Rows of C outside op's M x N (the padding) are untouched.
              for (int m = 0; m < c.M; ++m) {
                for (int n = c.N; n < o.ldc; ++n) {
                  const std::size_t i = static_cast<std::size_t>(m) * o.ldc + n;
                  CHECK(got[i] == o.C0[i]);
                }
              }
              tbb::global_control one(tbb::global_control::max_allowed_parallelism, 1);
              CHECK(run(c, o, p) == got);
            }
            tbb::global_control one(tbb::global_control::max_allowed_parallelism, 1);
            CHECK(run(c, o, Products::fp32) == f32);
          }
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

TEST_CASE("bf16 products refuse beta other than 0 or 1", "[gpt][gemm]") {
  if (!model::ops::bf16_products_available()) return;
  std::vector<float> a(16, 1.0f), b(16, 1.0f), c(16, 0.0f);
  CHECK_THROWS_WITH(
      model::ops::gemm(Products::bf16, false, false, 4, 4, 4, 2.0f, a.data(), 4, b.data(), 4, 0.5f, c.data(), 4),
      Catch::Contains("bf16 products take beta 0 or 1"));
}

TEST_CASE("fp16 products flush what fp16 cannot hold: below 2^-25 to zero, above 65504 to infinity", "[gpt][gemm]") {
  // A 1 x 1 x 1 product shows the operand rounding itself.
  auto product = [](float a, float b) {
    float c = 0.0f;
    model::ops::gemm(Products::fp16, false, false, 1, 1, 1, 1.0f, &a, 1, &b, 1, 0.0f, &c, 1);
    return c;
  };
  CHECK(product(std::ldexp(1.0f, -26), 1.0f) == 0.0f);                   // under half the smallest subnormal
  CHECK(product(std::ldexp(1.0f, -24), 1.0f) == std::ldexp(1.0f, -24));  // the smallest subnormal
  CHECK(product(1.0e-6f, 1.0f) == std::ldexp(17.0f, -24));               // subnormals keep few bits
  CHECK(std::isinf(product(70000.0f, 1.0f)));
  CHECK(product(0.1f, 1.0f) == fp16_to_fp32(fp32_to_fp16(0.1f)));
}

TEST_CASE("a Bf16Shadow gives bf16 products its codes: the same bits for true codes, only while it lives",
          "[gpt][gemm]") {
  if (!model::ops::bf16_products_available()) return;  // no bf16 products: shadows are never read
  const Case c{false, true, 150, 70, 90, 1.0f, 1.0f};
  const Operands o = operands(c);
  const auto plain = run(c, o, Products::bf16);
  std::vector<std::uint16_t> a16(o.A.size()), b16(o.B.size());
  for (std::size_t i = 0; i < a16.size(); ++i) a16[i] = fp32_to_bf16(o.A[i]);
  for (std::size_t i = 0; i < b16.size(); ++i) b16[i] = fp32_to_bf16(o.B[i]);
  {
    const model::ops::Bf16Shadow sa(o.A.data(), a16.data(), a16.size()), sb(o.B.data(), b16.data(), b16.size());
    CHECK(run(c, o, Products::bf16) == plain);
  }
  {  // the rounding constructor keeps the codes of the values it saw, each shadow in a buffer
     // of its own: values changed under them (against the protocol, to show it) are not read
    Operands o3 = o;
    const model::ops::Bf16Shadow sa(Products::bf16, o3.A.data(), o3.A.size());
    const model::ops::Bf16Shadow sb(Products::bf16, o3.B.data(), o3.B.size());
    for (auto& x : o3.A) x *= 4.0f;
    for (auto& x : o3.B) x *= 2.0f;
    CHECK(run(c, o3, Products::bf16) == plain);
    const model::ops::Bf16Shadow fp32(Products::fp32, o3.B.data(), o3.B.size());  // fp32 products: no shadow
    CHECK(run(c, o3, Products::bf16) == plain);
  }
  // Codes that are not the values' show whether the product read them: B's doubled.
  std::vector<std::uint16_t> twice(b16.size());
  for (std::size_t i = 0; i < twice.size(); ++i) twice[i] = fp32_to_bf16(2.0f * bf16_to_fp32(b16[i]));
  Operands o2 = o;
  for (auto& x : o2.B) x = bf16_to_fp32(fp32_to_bf16(x)) * 2.0f;  // the values the doubled codes hold
  const auto doubled = run(c, o2, Products::bf16);
  REQUIRE(doubled != plain);
  {
    const model::ops::Bf16Shadow sb(o.B.data(), twice.data(), twice.size());
    CHECK(run(c, o, Products::bf16) == doubled);
    // A shadow covering only part of the operand's span is not used.
    const model::ops::Bf16Shadow part(o.A.data() + 1, a16.data() + 1, a16.size() - 1);
    CHECK(run(c, o, Products::bf16) == doubled);
    // A newer shadow of the same memory hides the older one.
    const model::ops::Bf16Shadow newer(o.B.data(), b16.data(), b16.size());
    CHECK(run(c, o, Products::bf16) == plain);
  }
  CHECK(run(c, o, Products::bf16) == plain);  // gone with its scope
  // Per thread: a product on another thread rounds the values itself.
  const model::ops::Bf16Shadow sb(o.B.data(), twice.data(), twice.size());
  std::vector<float> other;
  std::thread([&] { other = run(c, o, Products::bf16); }).join();
  CHECK(other == plain);
}
