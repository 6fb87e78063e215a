// A host shard for optimizer tests: the fp32 master, gradient, m, v and the optional 16-bit
// copy as raw bytes in any supported dtype mix, with element access through strata's scalar
// conversions, seeded random fills and the StepArgs that point into it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "optim/step_args.h"
#include "runtime/core/dtype.h"
#include "tests/optim/reference.h"

namespace strata::test {

struct ShardSpec {
  DType grad = DType::fp32;
  DType state = DType::fp32;
  bool copy = false;
  DType copy_dtype = DType::bf16;
};

class TestShard {
 public:
  TestShard(std::size_t n, const ShardSpec& spec);

  std::size_t size() const noexcept { return n_; }
  const ShardSpec& spec() const noexcept { return spec_; }
  optim::StepArgs args(std::int64_t step, float grad_scale = 1.0f);

  double p(std::size_t i) const { return master_[i]; }
  double grad(std::size_t i) const { return load_as_fp32(grad_.data(), spec_.grad, i); }
  double m(std::size_t i) const { return load_as_fp32(m_.data(), spec_.state, i); }
  double v(std::size_t i) const { return load_as_fp32(v_.data(), spec_.state, i); }
  double copy(std::size_t i) const { return load_as_fp32(copy_.data(), spec_.copy_dtype, i); }
  void set_p(std::size_t i, float x) { master_[i] = x; }
  void set_grad(std::size_t i, float x) { store_from_fp32(grad_.data(), spec_.grad, i, x); }
  void set_m(std::size_t i, float x) { store_from_fp32(m_.data(), spec_.state, i, x); }
  void set_v(std::size_t i, float x) { store_from_fp32(v_.data(), spec_.state, i, x); }

  // The kernel's current state of element i as an exact starting point (no error yet).
  RefElem elem(std::size_t i) const { return {{p(i), 0}, {m(i), 0}, {v(i), 0}}; }

  // Random fills: params in [-1, 1]; gradients with log-uniform magnitudes over
  // [grad_lo, grad_hi], random signs, and about 2% exact zeros.
  void fill_params(std::mt19937& rng);
  void fill_grads(std::mt19937& rng, double grad_lo = 1e-6, double grad_hi = 1.0);

  // Every byte of master, m, v and copy (for "untouched" and "identical" checks).
  std::vector<unsigned char> snapshot() const;

 private:
  std::size_t n_;
  ShardSpec spec_;
  std::vector<float> master_;
  std::vector<unsigned char> grad_, m_, v_, copy_;
};

}  // namespace strata::test
