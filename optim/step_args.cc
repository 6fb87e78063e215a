// Validation of StepArgs/StepOptions (every check happens before a kernel starts: kernels run
// inside TBB bodies or on the GPU, where nothing may throw) and the traffic count.
#include "optim/step_args.h"

#include <cmath>
#include <cstdint>

#include "runtime/core/error.h"

namespace strata::optim {
namespace {

bool is_16bit(DType t) { return t == DType::bf16 || t == DType::fp16; }

// Alignment of a moment pointer: its element size (q8 blocks are bytes).
std::size_t state_align(MomentFormat f) { return f == MomentFormat::fp32 ? 4 : f == MomentFormat::bf16 ? 2 : 1; }

void check_aligned(const void* p, std::size_t align, const char* who, const char* what) {
  STRATA_CHECK(reinterpret_cast<std::uintptr_t>(p) % align == 0, Errc::invalid_argument, who, ": ", what, " pointer ",
               p, " is not aligned to its element size (", align, " B)");
}

}  // namespace

void validate_step_args(const StepArgs& a, StateUse use, const char* who) {
  STRATA_CHECK(a.grad_dtype == DType::fp32 || is_16bit(a.grad_dtype), Errc::invalid_argument, who, ": grad dtype ",
               dtype_name(a.grad_dtype), " is not supported: use fp32, bf16 or fp16");
  STRATA_CHECK(a.state_format != MomentFormat::q8 || use.q8, Errc::invalid_argument, who,
               ": q8 optimizer state is not supported here: use fp32 or bf16 (q8 moments are for Adam and AdamW)");
  STRATA_CHECK(a.state_format != MomentFormat::q8 || a.n % moment_align(MomentFormat::q8) == 0, Errc::invalid_argument,
               who, ": a shard of ", a.n, " elements with q8 moments: q8 steps whole blocks of ",
               moment_align(MomentFormat::q8), " elements");
  STRATA_CHECK(!a.copy || is_16bit(a.copy_dtype), Errc::invalid_argument, who, ": copy dtype ",
               dtype_name(a.copy_dtype), " is not supported: use bf16 or fp16");
  STRATA_CHECK(std::isfinite(a.grad_scale) && a.grad_scale >= 0.0f, Errc::invalid_argument, who, ": grad_scale ",
               a.grad_scale, " must be finite and >= 0");
  STRATA_CHECK(a.step >= 1, Errc::invalid_argument, who, ": step ", a.step,
               " must be >= 1 (the 1-based count of the step being taken)");
  if (a.n == 0) return;
  STRATA_CHECK(a.master, Errc::invalid_argument, who, ": master is null for a shard of ", a.n, " elements");
  STRATA_CHECK(a.grad, Errc::invalid_argument, who, ": grad is null for a shard of ", a.n, " elements");
  STRATA_CHECK(!use.m || a.m, Errc::invalid_argument, who, ": state m (exp_avg) is null for a shard of ", a.n,
               " elements");
  STRATA_CHECK(!use.v || a.v, Errc::invalid_argument, who, ": state v is null for a shard of ", a.n, " elements");
  check_aligned(a.master, sizeof(float), who, "master");
  check_aligned(a.grad, dtype_size(a.grad_dtype), who, "grad");
  if (use.m) check_aligned(a.m, state_align(a.state_format), who, "m");
  if (use.v) check_aligned(a.v, state_align(a.state_format), who, "v");
  if (a.copy) check_aligned(a.copy, dtype_size(a.copy_dtype), who, "copy");
  if (a.from.master != nullptr) {
    STRATA_CHECK((!use.m || a.from.m) && (!use.v || a.from.v), Errc::invalid_argument, who,
                 ": an out-of-place step needs the state it reads from: from.m and from.v for the state this "
                 "optimizer uses");
    check_aligned(a.from.master, sizeof(float), who, "from.master");
    if (use.m) check_aligned(a.from.m, state_align(a.state_format), who, "from.m");
    if (use.v) check_aligned(a.from.v, state_align(a.state_format), who, "from.v");
  }
}

void validate_step_options(const StepOptions& o, const char* who) {
  STRATA_CHECK(o.block_elems >= 1, Errc::invalid_argument, who, ": block_elems must be >= 1");
}

TrafficBytes traffic_per_param(const StepArgs& a, StateUse use) noexcept {
  const double state = moment_bytes_per_elem(a.state_format) * ((use.m ? 1 : 0) + (use.v ? 1 : 0));
  TrafficBytes t;
  t.read = double(sizeof(float) + dtype_size(a.grad_dtype)) + state;
  t.written = double(sizeof(float) + (a.copy ? dtype_size(a.copy_dtype) : 0)) + state;
  return t;
}

}  // namespace strata::optim
