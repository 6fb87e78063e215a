// Straightforward double-precision references of the optimizer updates, one element at a
// time, each carrying a first-order bound on how far a correct fp32 kernel may be from it.
// Every bound is built from the dtypes' own constants (std::numeric_limits<float>::epsilon,
// denorm_min, and dtype_info for bf16/fp16): each rounding the kernel performs adds
// u * |its result| + denorm_min (u = epsilon / 2, round to nearest), and input errors are
// propagated through each operation's derivative. No tolerance is typed by hand.
#pragma once

#include <cstdint>

#include "optim/adagrad.h"
#include "optim/adam.h"
#include "optim/lion.h"
#include "runtime/core/dtype.h"

namespace strata::test {

// A value and a bound on the error the kernel may have accumulated in it.
struct Tracked {
  double x = 0.0;
  double err = 0.0;
};

// One element's state: master p, first moment m, second moment / accumulator v.
struct RefElem {
  Tracked p, m, v;
};

// Unit roundoff and the absolute floor of one rounding to dtype t (fp32, bf16, fp16).
double unit_roundoff(DType t);
double rounding_floor(DType t);
// Error added by storing a value of magnitude |x| (+ err) in dtype t.
double storage_error(DType t, const Tracked& value);

// grad is the gradient element as stored (decoded exactly); grad_scale as in StepArgs.
void ref_adam(const optim::AdamConfig& c, std::int64_t step, double grad_scale, double grad, RefElem& e);
void ref_lion(const optim::LionConfig& c, double grad_scale, double grad, RefElem& e);
void ref_adagrad(const optim::AdagradConfig& c, std::int64_t step, double grad_scale, double grad, RefElem& e);

// |kernel - reference| within twice the bound (the factor covers second-order terms).
inline bool within(double kernel, const Tracked& ref) {
  const double d = kernel - ref.x;
  return (d <= 2 * ref.err && -d <= 2 * ref.err) || kernel == ref.x;
}

}  // namespace strata::test
