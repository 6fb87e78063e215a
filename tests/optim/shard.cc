// TestShard (shard.h).
#include "tests/optim/shard.h"

#include <cmath>
#include <cstring>

namespace strata::test {

TestShard::TestShard(std::size_t n, const ShardSpec& spec)
    : n_(n),
      spec_(spec),
      master_(n),
      grad_(n * dtype_size(spec.grad)),
      m_(n * dtype_size(spec.state)),
      v_(n * dtype_size(spec.state)),
      copy_(spec.copy ? n * dtype_size(spec.copy_dtype) : 0) {}

optim::StepArgs TestShard::args(std::int64_t step, float grad_scale) {
  optim::StepArgs a;
  a.master = master_.data();
  a.grad = grad_.data();
  a.grad_dtype = spec_.grad;
  a.m = m_.data();
  a.v = v_.data();
  a.state_format = spec_.state == DType::bf16 ? MomentFormat::bf16 : MomentFormat::fp32;
  a.copy = spec_.copy ? copy_.data() : nullptr;
  a.copy_dtype = spec_.copy_dtype;
  a.n = n_;
  a.grad_scale = grad_scale;
  a.step = step;
  return a;
}

void TestShard::fill_params(std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto& x : master_) x = u(rng);
}

void TestShard::fill_grads(std::mt19937& rng, double lo, double hi) {
  std::uniform_real_distribution<double> e(std::log(lo), std::log(hi));
  std::uniform_int_distribution<int> pct(0, 99);
  for (std::size_t i = 0; i < n_; ++i) {
    const int r = pct(rng);
    const double mag = r < 2 ? 0.0 : std::exp(e(rng));
    set_grad(i, static_cast<float>(r % 2 ? -mag : mag));
  }
}

std::vector<unsigned char> TestShard::snapshot() const {
  std::vector<unsigned char> out(master_.size() * sizeof(float));
  std::memcpy(out.data(), master_.data(), out.size());
  out.insert(out.end(), m_.begin(), m_.end());
  out.insert(out.end(), v_.begin(), v_.end());
  out.insert(out.end(), copy_.begin(), copy_.end());
  return out;
}

}  // namespace strata::test
