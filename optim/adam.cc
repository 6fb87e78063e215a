// Adam/AdamW on the CPU: the per-step constants, the vector kernel, and its instantiation for
// every grad x state x copy dtype combination.
#include "optim/adam.h"

#include <cmath>

#include "optim/detail/dispatch.h"
#include "optim/detail/q8_step.h"
#include "runtime/core/error.h"

namespace strata::optim {

void validate(const AdamConfig& c) {
  auto finite = [](float x) { return std::isfinite(x); };
  STRATA_CHECK(finite(c.lr) && c.lr >= 0.0f, Errc::invalid_argument, "adam lr ", c.lr, " must be finite and >= 0");
  STRATA_CHECK(finite(c.beta1) && c.beta1 >= 0.0f && c.beta1 < 1.0f, Errc::invalid_argument, "adam beta1 ", c.beta1,
               " must be in [0, 1)");
  STRATA_CHECK(finite(c.beta2) && c.beta2 >= 0.0f && c.beta2 < 1.0f, Errc::invalid_argument, "adam beta2 ", c.beta2,
               " must be in [0, 1)");
  STRATA_CHECK(finite(c.eps) && c.eps > 0.0f, Errc::invalid_argument, "adam eps ", c.eps, " must be finite and > 0");
  STRATA_CHECK(finite(c.weight_decay) && c.weight_decay >= 0.0f, Errc::invalid_argument, "adam weight_decay ",
               c.weight_decay, " must be finite and >= 0");
}

namespace detail {

AdamScalars adam_scalars(const AdamConfig& c, std::int64_t step, float grad_scale) {
  const double b1 = c.beta1, b2 = c.beta2, lr = c.lr, wd = c.weight_decay;
  const double t = static_cast<double>(step);
  const double bc1 = c.bias_correction ? 1.0 - std::pow(b1, t) : 1.0;
  const double bc2 = c.bias_correction ? 1.0 - std::pow(b2, t) : 1.0;
  AdamScalars s{};
  s.grad_scale = grad_scale;
  s.beta1 = c.beta1;
  s.one_minus_beta1 = static_cast<float>(1.0 - b1);
  s.beta2 = c.beta2;
  s.one_minus_beta2 = static_cast<float>(1.0 - b2);
  s.eps = c.eps;
  s.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  s.neg_step_size = static_cast<float>(-lr / bc1);
  s.decay = c.adamw_mode ? static_cast<float>(1.0 - lr * wd) : 1.0f;
  s.l2 = !c.adamw_mode && c.weight_decay > 0.0f;
  s.l2_decay = s.l2 ? c.weight_decay : 0.0f;
  return s;
}

namespace {

template <DType G, DType S, class Copy, bool kL2> struct AdamKernel {
  FB grad_scale, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, inv_sqrt_bc2, neg_step_size, decay, l2_decay;

  explicit AdamKernel(const AdamScalars& s)
      : grad_scale(s.grad_scale),
        beta1(s.beta1),
        one_minus_beta1(s.one_minus_beta1),
        beta2(s.beta2),
        one_minus_beta2(s.one_minus_beta2),
        eps(s.eps),
        inv_sqrt_bc2(s.inv_sqrt_bc2),
        neg_step_size(s.neg_step_size),
        decay(s.decay),
        l2_decay(s.l2_decay) {}

  template <bool kNonTemporal> void apply(const Slots& s, std::size_t i) const noexcept {
    float* master = static_cast<float*>(s.ptr[kMaster]);
    FB p = FB::load_unaligned(master + i);
    FB g = load_lanes<G>(s.ptr[kGrad], i) * grad_scale;
    if constexpr (kL2) g = fmadd(p, l2_decay, g);
    const FB m = fmadd(beta1, load_lanes<S>(s.ptr[kM], i), one_minus_beta1 * g);
    const FB v = fmadd(beta2, load_lanes<S>(s.ptr[kV], i), one_minus_beta2 * (g * g));
    const FB d = fmadd(xsimd::sqrt(v), inv_sqrt_bc2, eps);
    p = fmadd(m / d, neg_step_size, p * decay);
    p.store_unaligned(master + i);
    store_lanes<S>(s.ptr[kM], i, m);
    store_lanes<S>(s.ptr[kV], i, v);
    if constexpr (Copy::has) store_lanes<Copy::dtype, kNonTemporal>(s.ptr[kCopy], i, p);
  }
};

}  // namespace
}  // namespace detail

void adam_step(const AdamConfig& config, const StepArgs& args, const StepOptions& options) {
  constexpr StateUse use{true, true, true};
  validate(config);
  validate_step_args(args, use, "adam step");
  validate_step_options(options, "adam step");
  if (args.n == 0) return;
  const detail::AdamScalars s = detail::adam_scalars(config, args.step, args.grad_scale);
  const detail::Shard shard = detail::make_shard(args, use);
  if (args.state_format == MomentFormat::q8) {
    const auto salt = static_cast<std::uint32_t>(args.step);
    detail::with_grad_dtype(args.grad_dtype, [&](auto g) {
      detail::with_copy(args, [&](auto copy) {
        using Copy = decltype(copy);
        if (s.l2)
          detail::run_q8(shard, args.n, options.block_elems, salt,
                         detail::AdamKernel<decltype(g)::value, DType::fp32, Copy, true>(s));
        else
          detail::run_q8(shard, args.n, options.block_elems, salt,
                         detail::AdamKernel<decltype(g)::value, DType::fp32, Copy, false>(s));
      });
    });
    return;
  }
  detail::with_grad_dtype(args.grad_dtype, [&](auto g) {
    detail::with_state_dtype(args.state_format, [&](auto st) {
      detail::with_copy(args, [&](auto copy) {
        using Copy = decltype(copy);
        if (s.l2) {
          detail::run_elementwise(shard, args.n, options.block_elems,
                                  detail::AdamKernel<decltype(g)::value, decltype(st)::value, Copy, true>(s));
        } else {
          detail::run_elementwise(shard, args.n, options.block_elems,
                                  detail::AdamKernel<decltype(g)::value, decltype(st)::value, Copy, false>(s));
        }
      });
    });
  });
}

AdamW::AdamW(const AdamConfig& defaults, const StepOptions& options) : groups_(defaults), options_(options) {
  validate_step_options(options, "AdamW");
}

}  // namespace strata::optim
