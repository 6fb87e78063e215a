// CPU Muon (see muon.h).
#include "optim/muon.h"

#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>

#include "runtime/core/dtype.h"
#include "runtime/core/error.h"

namespace strata::optim {
namespace {

constexpr std::size_t kBlock = std::size_t{1} << 14;

template <class F> void blocks(std::size_t n, F&& f) {
  tbb::parallel_for(std::size_t{0}, (n + kBlock - 1) / kBlock, [&](std::size_t b) {
    const std::size_t i0 = b * kBlock;
    f(i0, std::min(n, i0 + kBlock));
  });
}

}  // namespace

void validate(const MuonConfig& c) {
  STRATA_CHECK(std::isfinite(c.lr) && c.lr >= 0, Errc::invalid_argument, "muon: lr = ", c.lr, " must be >= 0");
  STRATA_CHECK(c.momentum >= 0 && c.momentum < 1, Errc::invalid_argument, "muon: momentum = ", c.momentum,
               " must lie in [0, 1)");
  STRATA_CHECK(std::isfinite(c.weight_decay) && c.weight_decay >= 0, Errc::invalid_argument,
               "muon: weight_decay = ", c.weight_decay, " must be >= 0");
  STRATA_CHECK(c.ns.steps >= 0 && c.ns.steps <= 100, Errc::invalid_argument, "muon: ns_steps = ", c.ns.steps,
               " must lie in [0, 100]");
  STRATA_CHECK(std::isfinite(c.ns.eps) && c.ns.eps > 0, Errc::invalid_argument, "muon: eps = ", c.ns.eps,
               " must be > 0");
}

float muon_adjusted_lr(const MuonConfig& c, int rows, int cols) {
  const double r = rows, k = cols;
  const double ratio =
      c.adjust == MuonLrAdjust::original ? std::sqrt(std::max(1.0, r / k)) : 0.2 * std::sqrt(std::max(r, k));
  return static_cast<float>(c.lr * ratio);
}

void muon_momentum(const MuonConfig& c, const StepArgs& a, float* update) {
  validate(c);
  validate_step_args(a, {true, false}, "muon step");
  STRATA_CHECK(a.state_format == MomentFormat::fp32, Errc::invalid_argument,
               "muon step: the momentum is kept in fp32 (got ", moment_format_name(a.state_format), ")");
  auto* m = static_cast<float*>(a.m);
  const float w = 1.0f - c.momentum;
  blocks(a.n, [&](std::size_t i0, std::size_t i1) {
    float g[kBlock];
    convert(static_cast<const char*>(a.grad) + i0 * dtype_size(a.grad_dtype), a.grad_dtype, g, DType::fp32, i1 - i0);
    for (std::size_t i = i0; i < i1; ++i) {
      const float gi = g[i - i0] * a.grad_scale;
      m[i] = m[i] + w * (gi - m[i]);
      update[i] = c.nesterov ? m[i] - w * (m[i] - gi) : m[i];
    }
  });
}

void muon_apply(const MuonConfig& c, const StepArgs& a, const float* o, float adjusted_lr) {
  const float decay = 1.0f - c.lr * c.weight_decay;
  blocks(a.n, [&](std::size_t i0, std::size_t i1) {
    for (std::size_t i = i0; i < i1; ++i) a.master[i] = a.master[i] * decay - adjusted_lr * o[i];
    if (a.copy != nullptr)
      convert(a.master + i0, DType::fp32, static_cast<char*>(a.copy) + i0 * dtype_size(a.copy_dtype), a.copy_dtype,
              i1 - i0);
  });
}

void muon_step(const MuonConfig& c, const StepArgs& a, int rows, int cols, MuonScratch& s) {
  STRATA_CHECK(rows > 0 && cols > 0 && a.n == static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols),
               Errc::invalid_argument, "muon step: a ", rows, " x ", cols, " matrix of ", a.n, " elements");
  if (s.update.size() < a.n) s.update.resize(a.n);
  muon_momentum(c, a, s.update.data());
  newton_schulz(s.update.data(), rows, cols, c.ns, s.ns);
  muon_apply(c, a, s.update.data(), muon_adjusted_lr(c, rows, cols));
}

}  // namespace strata::optim
