// Adagrad on the CPU: constants, vector kernel, dtype instantiation.
#include "optim/adagrad.h"

#include <cmath>

#include "optim/detail/dispatch.h"
#include "runtime/core/error.h"

namespace strata::optim {

void validate(const AdagradConfig& c) {
  auto finite = [](float x) { return std::isfinite(x); };
  STRATA_CHECK(finite(c.lr) && c.lr >= 0.0f, Errc::invalid_argument, "adagrad lr ", c.lr, " must be finite and >= 0");
  STRATA_CHECK(finite(c.lr_decay) && c.lr_decay >= 0.0f, Errc::invalid_argument, "adagrad lr_decay ", c.lr_decay,
               " must be finite and >= 0");
  STRATA_CHECK(finite(c.eps) && c.eps > 0.0f, Errc::invalid_argument, "adagrad eps ", c.eps, " must be finite and > 0");
  STRATA_CHECK(finite(c.weight_decay) && c.weight_decay >= 0.0f, Errc::invalid_argument, "adagrad weight_decay ",
               c.weight_decay, " must be finite and >= 0");
}

namespace detail {

AdagradScalars adagrad_scalars(const AdagradConfig& c, std::int64_t step, float grad_scale) {
  AdagradScalars s{};
  s.grad_scale = grad_scale;
  s.eps = c.eps;
  s.neg_clr = static_cast<float>(-static_cast<double>(c.lr) /
                                 (1.0 + static_cast<double>(step - 1) * static_cast<double>(c.lr_decay)));
  s.l2 = c.weight_decay > 0.0f;
  s.l2_decay = c.weight_decay;
  return s;
}

namespace {

template <DType G, DType S, class Copy, bool kL2> struct AdagradKernel {
  FB grad_scale, eps, neg_clr, l2_decay;

  explicit AdagradKernel(const AdagradScalars& s)
      : grad_scale(s.grad_scale), eps(s.eps), neg_clr(s.neg_clr), l2_decay(s.l2_decay) {}

  template <bool kNonTemporal> void apply(const Slots& s, std::size_t i) const noexcept {
    float* master = static_cast<float*>(s.ptr[kMaster]);
    FB p = FB::load_unaligned(master + i);
    FB g = load_lanes<G>(s.ptr[kGrad], i) * grad_scale;
    if constexpr (kL2) g = fmadd(p, l2_decay, g);
    const FB v = fmadd(g, g, load_lanes<S>(s.ptr[kV], i));
    p = fmadd(g / (xsimd::sqrt(v) + eps), neg_clr, p);
    p.store_unaligned(master + i);
    store_lanes<S>(s.ptr[kV], i, v);
    if constexpr (Copy::has) store_lanes<Copy::dtype, kNonTemporal>(s.ptr[kCopy], i, p);
  }
};

}  // namespace
}  // namespace detail

void adagrad_step(const AdagradConfig& config, const StepArgs& args, const StepOptions& options) {
  constexpr StateUse use{false, true};
  validate(config);
  validate_step_args(args, use, "adagrad step");
  validate_step_options(options, "adagrad step");
  if (args.n == 0) return;
  const detail::AdagradScalars s = detail::adagrad_scalars(config, args.step, args.grad_scale);
  const detail::Shard shard = detail::make_shard(args, use);
  detail::with_grad_dtype(args.grad_dtype, [&](auto g) {
    detail::with_state_dtype(args.state_format, [&](auto st) {
      detail::with_copy(args, [&](auto copy) {
        using Copy = decltype(copy);
        constexpr DType G = decltype(g)::value, S = decltype(st)::value;
        if (s.l2)
          detail::run_elementwise(shard, args.n, options.block_elems, detail::AdagradKernel<G, S, Copy, true>(s));
        else
          detail::run_elementwise(shard, args.n, options.block_elems, detail::AdagradKernel<G, S, Copy, false>(s));
      });
    });
  });
}

Adagrad::Adagrad(const AdagradConfig& defaults, const StepOptions& options) : groups_(defaults), options_(options) {
  validate_step_options(options, "Adagrad");
}

}  // namespace strata::optim
