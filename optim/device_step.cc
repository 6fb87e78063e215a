// Backend dispatch for device_step.h.
#include "optim/device_step.h"

#include <cmath>
#include <memory>
#include <vector>

#include "optim/detail/cuda_launch.h"
#include "runtime/core/error.h"

namespace strata::optim {

void adam_step_async(device::Stream& stream, const AdamConfig& config, const StepArgs& args) {
  validate(config);
  validate_step_args(args, {true, true, true}, "adam step (device)");
  if (args.n == 0) return;
  if (stream.backend() == device::Backend::cuda) {
    STRATA_CHECK(args.from.master == nullptr, Errc::unsupported,
                 "adam step (device): the CUDA kernel steps in place; an out-of-place step runs on the CPU");
    detail::cuda_adam_step_async(stream.native_handle(), detail::adam_scalars(config, args.step, args.grad_scale),
                                 args);
    return;
  }
  stream.launch_host([config, args] { adam_step(config, args); });
}

GradNorm grad_norm_sq(device::Device& dev, device::Stream& stream, const void* grad, DType dtype, std::size_t n) {
  STRATA_CHECK(dtype == DType::fp32 || dtype == DType::bf16 || dtype == DType::fp16, Errc::invalid_argument,
               "grad_norm_sq (device): dtype ", dtype_name(dtype), " is not supported: use fp32, bf16 or fp16");
  if (n == 0) return {};
  STRATA_CHECK(grad, Errc::invalid_argument, "grad_norm_sq (device): grad is null for ", n, " elements");
  if (stream.backend() != device::Backend::cuda) {
    auto out = std::make_shared<GradNorm>();
    stream.launch_host([out, grad, dtype, n] { *out = grad_norm_sq(grad, dtype, n); });
    stream.synchronize();
    return *out;
  }
  const std::size_t blocks = (n + kNormBlockElems - 1) / kNormBlockElems;
  const std::size_t bytes = blocks * sizeof(double);
  std::vector<double> partial(blocks);
  void* dev_partial = dev.allocate_async(bytes, stream, "grad norm partials");
  try {
    detail::cuda_grad_norm_partials_async(stream.native_handle(), grad, dtype, n, static_cast<double*>(dev_partial));
    stream.copy_async(partial.data(), dev_partial, bytes, device::CopyKind::device_to_host);
  } catch (...) {
    dev.free_async(dev_partial, stream);
    throw;
  }
  dev.free_async(dev_partial, stream);
  stream.synchronize();
  GradNorm out;
  for (double p : partial) out.sumsq += p;  // block order: the fixed order that makes it reproducible
  out.finite = std::isfinite(out.sumsq);
  return out;
}

}  // namespace strata::optim
