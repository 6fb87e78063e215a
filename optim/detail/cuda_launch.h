// Launchers of the CUDA kernels (cuda_adam.cu, cuda_grad_norm.cu), or of the stub that
// reports "built without CUDA". Callers validate first (device_step.cc); pointers are device
// memory; work is enqueued on the given cudaStream_t and nothing waits for it.
#pragma once

#include <cstddef>

#include "optim/detail/update_scalars.h"
#include "optim/step_args.h"
#include "runtime/core/dtype.h"

namespace strata::optim::detail {

void cuda_adam_step_async(void* cuda_stream, const AdamScalars& scalars, const StepArgs& args);

// partials[b] = sum of squares of elements [b*kNormBlockElems, (b+1)*kNormBlockElems), summed
// in a fixed tree order; partials must hold ceil(n / kNormBlockElems) doubles.
void cuda_grad_norm_partials_async(void* cuda_stream, const void* grad, DType dtype, std::size_t n, double* partials);

}  // namespace strata::optim::detail
