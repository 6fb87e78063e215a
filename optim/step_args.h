// What one optimizer step updates (StepArgs) and how it is run (StepOptions), shared by every
// optimizer in this folder, CPU and CUDA. The ZeRO engine hands over one contiguous shard per
// call: the fp32 master weights, the gradient, the optimizer state and, when asked, the
// 16-bit copy of the parameters it will gather to the device.
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/core/dtype.h"
#include "runtime/core/moment_format.h"

namespace strata::optim {

// Protocol. The caller owns every buffer; none may overlap another (the master, m and v are
// updated in place). All pointers are host memory for the CPU kernels and device memory for
// the CUDA ones. Which state buffers an optimizer uses:
//   Adam/AdamW: m = exp_avg, v = exp_avg_sq.   Lion: m = exp_avg.   Adagrad: v = sum of g^2.
// An unused state pointer is ignored. The gradient is multiplied by grad_scale as it is read
// (1 / loss_scale x clip coefficient, see clip.h): it is never unscaled in place. The caller
// makes sure the gradient is finite first (grad_norm.h): a step on a NaN/Inf gradient writes
// NaN into the state, so skipping is decided before the step (step_plan.h), not inside it.
// Out of place (CPU kernels only): with `from` set, the state before the step is read from
// from.master/m/v (the ones the optimizer uses) and the stepped state goes to master/m/v, the
// same bits as copying it there and stepping in place, in one pass per block of the shard
// while it is in cache; `from` may not overlap the destinations.
struct StepArgs {
  float* master = nullptr;     // fp32 master weights, updated in place
  const void* grad = nullptr;  // gradient: fp32, bf16 or fp16
  DType grad_dtype = DType::fp32;
  void* m = nullptr;  // first moment
  void* v = nullptr;  // second moment / accumulator
  // fp32, bf16 (rounded to nearest even each step) or q8 (Adam/AdamW only: blocks of 16
  // elements, coded as runtime/core/q8_codec.h says with the step as salt; n a multiple of 16).
  MomentFormat state_format = MomentFormat::fp32;
  void* copy = nullptr;            // optional: params written for the device, copy_dtype
  DType copy_dtype = DType::bf16;  // bf16 or fp16
  std::size_t n = 0;               // elements in the shard
  float grad_scale = 1.0f;         // gradient multiplier, finite and >= 0
  std::int64_t step = 1;           // this step's 1-based count (bias correction, lr decay)
  struct Source {
    const float* master = nullptr;
    const void* m = nullptr;
    const void* v = nullptr;
  };
  Source from;  // out of place: the state before the step (null master: in place)
};

struct StepOptions {
  // Elements per unit of TBB work. Results are bitwise identical for any value and any
  // thread count; it only trades scheduling overhead against load balance.
  std::size_t block_elems = std::size_t{1} << 15;
};

// Which state buffers an optimizer reads and writes.
struct StateUse {
  bool m = false;
  bool v = false;
  bool q8 = false;  // the optimizer steps q8 moments
};

// Throws Errc::invalid_argument naming `who` ("adamw step") and the offending field.
void validate_step_args(const StepArgs& args, StateUse use, const char* who);
void validate_step_options(const StepOptions& options, const char* who);

// Bytes one parameter moves through memory in a step: reads of master, grad and the used
// state, writes of master, the used state and the copy (the figure a roofline divides by).
struct TrafficBytes {
  double read = 0;  // q8 moments take 17/16 bytes an element
  double written = 0;
  double total() const noexcept { return read + written; }
};
TrafficBytes traffic_per_param(const StepArgs& args, StateUse use) noexcept;

}  // namespace strata::optim
