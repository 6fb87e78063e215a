// Turns the run-time dtypes of a StepArgs into compile-time kernel parameters (one kernel
// instantiation per grad x state x copy combination, so the inner loop has no branches), and
// describes the shard's buffers to the block driver.
#pragma once

#include <type_traits>

#include "optim/detail/block_loop.h"
#include "optim/step_args.h"

namespace strata::optim::detail {

template <DType T> using DTag = std::integral_constant<DType, T>;

// The copy-out as a type: has = false when StepArgs::copy is null.
template <bool kHas, DType T> struct CopyTag {
  static constexpr bool has = kHas;
  static constexpr DType dtype = T;
};

template <class F> void with_grad_dtype(DType t, F&& f) {
  switch (t) {
    case DType::bf16:
      f(DTag<DType::bf16>{});
      break;
    case DType::fp16:
      f(DTag<DType::fp16>{});
      break;
    default:
      f(DTag<DType::fp32>{});
      break;
  }
}

// fp32 and bf16 moments (q8 moments have a kernel of their own, detail/q8_step.h).
template <class F> void with_state_dtype(MomentFormat t, F&& f) {
  if (t == MomentFormat::bf16)
    f(DTag<DType::bf16>{});
  else
    f(DTag<DType::fp32>{});
}

template <class F> void with_copy(const StepArgs& a, F&& f) {
  if (!a.copy)
    f(CopyTag<false, DType::bf16>{});
  else if (a.copy_dtype == DType::fp16)
    f(CopyTag<true, DType::fp16>{});
  else
    f(CopyTag<true, DType::bf16>{});
}

// The copy-out is streamed (non-temporal: nothing reads it back on the host); the in-place
// buffers are written normally since their lines are already in cache from the read.
inline Shard make_shard(const StepArgs& a, StateUse use) {
  Shard sh;
  sh.base.ptr[kMaster] = a.master;
  sh.elem_bytes[kMaster] = sizeof(float);
  sh.written[kMaster] = true;
  if (a.from.master != nullptr) {
    sh.from[kMaster] = a.from.master;
    if (use.m) sh.from[kM] = a.from.m;
    if (use.v) sh.from[kV] = a.from.v;
  }
  sh.base.ptr[kGrad] = const_cast<void*>(a.grad);  // read only: never in `written`
  sh.elem_bytes[kGrad] = dtype_size(a.grad_dtype);
  if (use.m) {
    sh.base.ptr[kM] = a.m;
    sh.elem_bytes[kM] = moment_bytes(a.state_format, 1);
    sh.written[kM] = true;
  }
  if (use.v) {
    sh.base.ptr[kV] = a.v;
    sh.elem_bytes[kV] = moment_bytes(a.state_format, 1);
    sh.written[kV] = true;
  }
  if (a.copy) {
    sh.base.ptr[kCopy] = a.copy;
    sh.elem_bytes[kCopy] = dtype_size(a.copy_dtype);
    sh.written[kCopy] = true;
    sh.align_slot = kCopy;
  }
  return sh;
}

}  // namespace strata::optim::detail
