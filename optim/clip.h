// Global-norm gradient clipping, PyTorch's clip_grad_norm_ and DeepSpeed's gradient_clipping
// convention, as a factor folded into the optimizer's grad_scale instead of a pass that
// rewrites the gradients.
#pragma once

namespace strata::optim {

// max_norm / (total_norm + 1e-6) when total_norm > max_norm, else 1. max_norm <= 0 turns
// clipping off (DeepSpeed gradient_clipping: 0). A non-finite total_norm gives 1: that step
// is skipped as an overflow, never clipped.
double clip_coefficient(double total_norm, double max_norm) noexcept;

}  // namespace strata::optim
