// The gradient norm pass: exact where the sum is representable, within the recursive-sum
// bound of a double reference otherwise, NaN/Inf detected anywhere, huge finite values never
// mistaken for overflow.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "optim/grad_norm.h"
#include "runtime/core/error.h"

using namespace strata;

namespace {

std::vector<unsigned char> encode(const std::vector<float>& v, DType t) {
  std::vector<unsigned char> out(v.size() * dtype_size(t));
  convert(v.data(), DType::fp32, out.data(), t, v.size());
  return out;
}

}  // namespace

TEST_CASE("the norm of exactly representable inputs is exact", "[optim]") {
  const DType t = GENERATE(DType::fp32, DType::bf16, DType::fp16);
  const std::size_t n = GENERATE(std::size_t{1}, std::size_t{4095}, std::size_t{4097}, std::size_t{300001});
  CAPTURE(dtype_name(t), n);
  // Powers of two in [2^-8, 2^8]: every square and every partial sum fits in 53 bits.
  std::vector<float> g(n);
  double want = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const int e = static_cast<int>(i % 17) - 8;
    g[i] = std::ldexp(i % 3 ? 1.0f : -1.0f, e);
    want += std::ldexp(1.0, 2 * e);
  }
  const auto bytes = encode(g, t);
  const auto r = optim::grad_norm_sq(bytes.data(), t, n);
  CHECK(r.finite);
  CHECK(r.sumsq == want);
}

TEST_CASE("the norm of random gradients is within the summation bound of a double reference", "[optim]") {
  const DType t = GENERATE(DType::fp32, DType::bf16, DType::fp16);
  constexpr std::size_t n = 1 << 18;
  std::mt19937 rng(31);
  std::normal_distribution<float> d(0.0f, 1e-2f);
  std::vector<float> g(n);
  for (auto& x : g) x = d(rng);
  const auto bytes = encode(g, t);
  double ref = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double x = load_as_fp32(bytes.data(), t, i);
    ref += x * x;  // squares of floats are exact in double; only the additions round
  }
  const auto r = optim::grad_norm_sq(bytes.data(), t, n);
  // Any order of n - 1 additions of non-negative terms: |error| <= (n - 1) u sum (x 2 for both).
  const double bound = 2.0 * static_cast<double>(n) * std::numeric_limits<double>::epsilon() / 2 * ref;
  CHECK(std::fabs(r.sumsq - ref) <= bound);
}

TEST_CASE("NaN and Inf are detected wherever they sit", "[optim][boundary]") {
  const DType t = GENERATE(DType::fp32, DType::bf16, DType::fp16);
  const float bad = GENERATE(std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                             -std::numeric_limits<float>::infinity());
  constexpr std::size_t n = 70000;
  const std::size_t where = GENERATE(std::size_t{0}, std::size_t{4096}, std::size_t{69999});
  CAPTURE(dtype_name(t), bad, where);
  std::vector<float> g(n, 0.5f);
  g[where] = bad;
  const auto bytes = encode(g, t);
  CHECK_FALSE(optim::grad_norm_sq(bytes.data(), t, n).finite);
}

TEST_CASE("the largest finite gradients are not mistaken for an overflow", "[optim][boundary]") {
  const DType t = GENERATE(DType::fp32, DType::bf16, DType::fp16);
  const float big = dtype_info(t).max_finite;
  std::vector<float> g(100000, -big);
  const auto bytes = encode(g, t);
  const auto r = optim::grad_norm_sq(bytes.data(), t, g.size());
  CHECK(r.finite);
  const double want = static_cast<double>(big) * big * static_cast<double>(g.size());
  CHECK(std::fabs(r.sumsq - want) <= static_cast<double>(g.size()) * std::numeric_limits<double>::epsilon() * want);
}

TEST_CASE("combining shard norms in a fixed order is reproducible", "[optim]") {
  std::vector<float> g(50000);
  std::mt19937 rng(37);
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto& x : g) x = u(rng);
  optim::GradNorm total;
  total += optim::grad_norm_sq(g.data(), DType::fp32, 20000);
  total += optim::grad_norm_sq(g.data() + 20000, DType::fp32, 30000);
  optim::GradNorm again;
  again += optim::grad_norm_sq(g.data(), DType::fp32, 20000);
  again += optim::grad_norm_sq(g.data() + 20000, DType::fp32, 30000);
  CHECK(total.sumsq == again.sumsq);
  CHECK(total.finite);
  CHECK(optim::grad_norm_sq(nullptr, DType::fp32, 0).sumsq == 0.0);
}

TEST_CASE("the norm pass rejects dtypes it does not read", "[optim][negative]") {
  std::vector<unsigned char> g(16);
  CHECK_THROWS_WITH(optim::grad_norm_sq(g.data(), DType::fp8_e4m3, 16), Catch::Contains("fp8_e4m3"));
  CHECK_THROWS_WITH(optim::grad_norm_sq(nullptr, DType::fp32, 16), Catch::Contains("null"));
}
