// Lion on the CPU: constants, vector kernel, dtype instantiation.
#include "optim/lion.h"

#include <cmath>

#include "optim/detail/dispatch.h"
#include "runtime/core/error.h"

namespace strata::optim {

void validate(const LionConfig& c) {
  auto finite = [](float x) { return std::isfinite(x); };
  STRATA_CHECK(finite(c.lr) && c.lr >= 0.0f, Errc::invalid_argument, "lion lr ", c.lr, " must be finite and >= 0");
  STRATA_CHECK(finite(c.beta1) && c.beta1 >= 0.0f && c.beta1 < 1.0f, Errc::invalid_argument, "lion beta1 ", c.beta1,
               " must be in [0, 1)");
  STRATA_CHECK(finite(c.beta2) && c.beta2 >= 0.0f && c.beta2 < 1.0f, Errc::invalid_argument, "lion beta2 ", c.beta2,
               " must be in [0, 1)");
  STRATA_CHECK(finite(c.weight_decay) && c.weight_decay >= 0.0f, Errc::invalid_argument, "lion weight_decay ",
               c.weight_decay, " must be finite and >= 0");
}

namespace detail {

LionScalars lion_scalars(const LionConfig& c, float grad_scale) {
  LionScalars s{};
  s.grad_scale = grad_scale;
  s.beta1 = c.beta1;
  s.one_minus_beta1 = static_cast<float>(1.0 - static_cast<double>(c.beta1));
  s.beta2 = c.beta2;
  s.one_minus_beta2 = static_cast<float>(1.0 - static_cast<double>(c.beta2));
  s.neg_lr = -c.lr;
  s.decay = static_cast<float>(1.0 - static_cast<double>(c.lr) * c.weight_decay);
  return s;
}

namespace {

template <DType G, DType S, class Copy> struct LionKernel {
  FB grad_scale, beta1, one_minus_beta1, beta2, one_minus_beta2, neg_lr, decay;

  explicit LionKernel(const LionScalars& s)
      : grad_scale(s.grad_scale),
        beta1(s.beta1),
        one_minus_beta1(s.one_minus_beta1),
        beta2(s.beta2),
        one_minus_beta2(s.one_minus_beta2),
        neg_lr(s.neg_lr),
        decay(s.decay) {}

  template <bool kNonTemporal> void apply(const Slots& s, std::size_t i) const noexcept {
    float* master = static_cast<float*>(s.ptr[kMaster]);
    const FB g = load_lanes<G>(s.ptr[kGrad], i) * grad_scale;
    const FB m = load_lanes<S>(s.ptr[kM], i);
    const FB c = fmadd(beta1, m, one_minus_beta1 * g);
    const FB zero(0.0f), one(1.0f);
    const FB sign = xsimd::select(c > zero, one, zero) - xsimd::select(c < zero, one, zero);
    const FB p = fmadd(sign, neg_lr, FB::load_unaligned(master + i) * decay);
    p.store_unaligned(master + i);
    store_lanes<S>(s.ptr[kM], i, fmadd(beta2, m, one_minus_beta2 * g));
    if constexpr (Copy::has) store_lanes<Copy::dtype, kNonTemporal>(s.ptr[kCopy], i, p);
  }
};

}  // namespace
}  // namespace detail

void lion_step(const LionConfig& config, const StepArgs& args, const StepOptions& options) {
  constexpr StateUse use{true, false};
  validate(config);
  validate_step_args(args, use, "lion step");
  validate_step_options(options, "lion step");
  if (args.n == 0) return;
  const detail::LionScalars s = detail::lion_scalars(config, args.grad_scale);
  const detail::Shard shard = detail::make_shard(args, use);
  detail::with_grad_dtype(args.grad_dtype, [&](auto g) {
    detail::with_state_dtype(args.state_format, [&](auto st) {
      detail::with_copy(args, [&](auto copy) {
        detail::run_elementwise(shard, args.n, options.block_elems,
                                detail::LionKernel<decltype(g)::value, decltype(st)::value, decltype(copy)>(s));
      });
    });
  });
}

Lion::Lion(const LionConfig& defaults, const StepOptions& options) : groups_(defaults), options_(options) {
  validate_step_options(options, "Lion");
}

}  // namespace strata::optim
