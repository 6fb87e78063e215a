// Double-precision optimizer references with propagated fp32 rounding bounds (reference.h).
// Each line mirrors one rounding step of optim/detail/update_scalars.h.
#include "tests/optim/reference.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "optim/kernel_info.h"

namespace strata::test {
namespace {

const double kU = std::numeric_limits<float>::epsilon() / 2;  // fp32 unit roundoff
const double kT = std::numeric_limits<float>::denorm_min();   // fp32 absolute floor

// One fp32 rounding of a result x (exact value) whose inputs carried `in_err`.
Tracked rounded(double x, double in_err) { return {x, in_err + kU * std::fabs(x) + kT}; }

// prod + addend as the kernel's multiply-add: one rounding of the sum, plus one of the product
// on ISAs without FMA (optim::kernel_fused_fma()).
Tracked fused(double prod, double addend, double in_err) {
  const double extra = optim::kernel_fused_fma() ? 0.0 : kU * std::fabs(prod) + kT;
  return rounded(prod + addend, in_err + extra);
}

// A hyperparameter-derived constant, rounded once to fp32 when the kernel computes it.
double const_err(double c) { return kU * std::fabs(c); }

Tracked sqrt_of(const Tracked& a) {
  const double s = std::sqrt(std::max(a.x, 0.0));
  const double prop = s > 0 ? std::min(a.err / s, std::sqrt(a.err)) : std::sqrt(a.err);
  return rounded(s, prop);
}

Tracked quotient(const Tracked& n, const Tracked& d) {
  const double q = n.x / d.x;
  const double denom = std::max(std::fabs(d.x) - d.err, std::fabs(d.x) * 0.5);
  return rounded(q, (n.err + std::fabs(q) * d.err) / denom);
}

}  // namespace

double unit_roundoff(DType t) {
  if (t == DType::fp32) return kU;
  return std::ldexp(1.0, -dtype_info(t).man_bits - 1);
}

double rounding_floor(DType t) {
  if (t == DType::fp32) return kT;
  const auto& info = dtype_info(t);
  return std::ldexp(1.0, 1 - info.bias - info.man_bits);  // the smallest subnormal
}

double storage_error(DType t, const Tracked& v) {
  if (t == DType::fp32) return 0.0;
  return unit_roundoff(t) * (std::fabs(v.x) + v.err) + rounding_floor(t);
}

void ref_adam(const optim::AdamConfig& c, std::int64_t step, double grad_scale, double grad, RefElem& e) {
  const double b1 = c.beta1, b2 = c.beta2, lr = c.lr, wd = c.weight_decay, eps = c.eps;
  const double t = static_cast<double>(step);
  const double bc1 = c.bias_correction ? 1 - std::pow(b1, t) : 1.0;
  const double bc2 = c.bias_correction ? 1 - std::pow(b2, t) : 1.0;
  Tracked g = rounded(grad * grad_scale, 0.0);
  if (!c.adamw_mode && wd > 0) g = fused(wd * e.p.x, g.x, g.err + wd * e.p.err);
  const double c1 = 1 - b1, c2 = 1 - b2;
  const Tracked mg = rounded(c1 * g.x, c1 * g.err + const_err(c1 * g.x));
  const Tracked m = fused(b1 * e.m.x, mg.x, b1 * e.m.err + mg.err);
  const Tracked gg = rounded(g.x * g.x, 2 * std::fabs(g.x) * g.err + g.err * g.err);
  const Tracked vg = rounded(c2 * gg.x, c2 * gg.err + const_err(c2 * gg.x));
  const Tracked v = fused(b2 * e.v.x, vg.x, b2 * e.v.err + vg.err);
  const Tracked s = sqrt_of(v);
  const double r = 1 / std::sqrt(bc2);
  const Tracked d = fused(s.x * r, eps, r * s.err + const_err(s.x * r));
  const Tracked q = quotient(m, d);
  const double step_size = lr / bc1;
  Tracked pd = e.p;
  if (c.adamw_mode && wd > 0) {
    const double decay = 1 - lr * wd;
    pd = rounded(e.p.x * decay, decay * e.p.err + const_err(e.p.x * decay));
  }
  const Tracked p = fused(-step_size * q.x, pd.x, pd.err + step_size * q.err + const_err(step_size * q.x));
  e = {p, m, v};
}

void ref_lion(const optim::LionConfig& c, double grad_scale, double grad, RefElem& e) {
  const double b1 = c.beta1, b2 = c.beta2, lr = c.lr, wd = c.weight_decay;
  const double c1 = 1 - b1, c2 = 1 - b2;
  const Tracked g = rounded(grad * grad_scale, 0.0);
  const Tracked mg = rounded(c1 * g.x, c1 * g.err + const_err(c1 * g.x));
  const Tracked u = fused(b1 * e.m.x, mg.x, b1 * e.m.err + mg.err);
  const double sign = u.x > 0 ? 1.0 : (u.x < 0 ? -1.0 : 0.0);
  const bool ambiguous = std::fabs(u.x) <= 2 * u.err;  // the kernel may see the other sign
  const double decay = 1 - lr * wd;
  const Tracked pd = wd > 0 ? rounded(e.p.x * decay, decay * e.p.err + const_err(e.p.x * decay)) : e.p;
  Tracked p = rounded(pd.x - lr * sign, pd.err);
  if (ambiguous) p.err += 2 * lr;
  const Tracked g2 = rounded(c2 * g.x, c2 * g.err + const_err(c2 * g.x));
  const Tracked m = fused(b2 * e.m.x, g2.x, b2 * e.m.err + g2.err);
  e.p = p;
  e.m = m;
}

void ref_adagrad(const optim::AdagradConfig& c, std::int64_t step, double grad_scale, double grad, RefElem& e) {
  const double lr = c.lr, wd = c.weight_decay, eps = c.eps;
  const double clr = lr / (1 + static_cast<double>(step - 1) * c.lr_decay);
  Tracked g = rounded(grad * grad_scale, 0.0);
  if (wd > 0) g = fused(wd * e.p.x, g.x, g.err + wd * e.p.err);
  const Tracked v = fused(g.x * g.x, e.v.x, e.v.err + 2 * std::fabs(g.x) * g.err + g.err * g.err);
  const Tracked s = sqrt_of(v);
  const Tracked d = rounded(s.x + eps, s.err);
  const Tracked q = quotient(g, d);
  const Tracked p = fused(-clr * q.x, e.p.x, e.p.err + clr * q.err + const_err(clr * q.x));
  e.p = p;
  e.v = v;
}

}  // namespace strata::test
