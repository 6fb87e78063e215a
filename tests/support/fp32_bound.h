// The fp32 sum bound the model op tests hold fast kernels to: a length-K fp32 sum is within
// gamma_K = K u / (1 - K u) of the exact one relative to the sum of |terms| (u = epsilon / 2).
// require_close checks max |a - b| <= gamma_K * scale, where scale bounds the sum of |terms|
// of one output.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace strata::test {

inline double gamma_k(std::size_t K) {
  const double u = std::numeric_limits<float>::epsilon() / 2.0;
  return static_cast<double>(K) * u / (1.0 - static_cast<double>(K) * u);
}

inline void require_close(const std::vector<float>& a, const std::vector<float>& b, std::size_t K, double scale,
                          const char* what) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]));
  INFO(what << ": worst " << worst << " bound " << gamma_k(K) * scale << " (K " << K << ")");
  CHECK(worst <= gamma_k(K) * scale);
}

// ||a - b|| / ||b|| (2-norms): how far a result is from its reference as a whole, for sums
// whose order changed (chunked or split products) where an elementwise bound is too loose.
template <class T> inline double normwise_difference(const std::vector<float>& a, const std::vector<T>& b) {
  REQUIRE(a.size() == b.size());
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
    diff += d * d;
    norm += static_cast<double>(b[i]) * static_cast<double>(b[i]);
  }
  return std::sqrt(diff / norm);
}

inline double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, static_cast<double>(std::abs(x)));
  return m;
}

}  // namespace strata::test
