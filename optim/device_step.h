// Optimizer work on a device Stream, one call for both backends (docs/design.md, "runtime/device"):
// the host backend runs the CPU kernels on the stream's worker, the CUDA backend launches the
// CUDA kernels (cuda_adam.cu, cuda_grad_norm.cu) with the same arithmetic. Pointers are the
// stream's device memory (host arena or CUDA). Arguments are validated on the calling thread,
// before anything is enqueued.
#pragma once

#include <cstddef>

#include "optim/adam.h"
#include "optim/grad_norm.h"
#include "runtime/device/device.h"

namespace strata::optim {

// Enqueues one Adam/AdamW step; the buffers must stay alive until the stream reaches it.
void adam_step_async(device::Stream& stream, const AdamConfig& config, const StepArgs& args);

// The squared norm and finiteness of a device gradient, in a fixed summation order (same bits
// on every run; CUDA and CPU differ only by that order). Waits for `stream`.
GradNorm grad_norm_sq(device::Device& device, device::Stream& stream, const void* grad, DType dtype, std::size_t n);

}  // namespace strata::optim
