// The per-step constants of each update rule, derived once on the host (in double, rounded
// once to float) and handed unchanged to the CPU and the CUDA kernels, so both start from the
// same bits. Plain structs: this header is also compiled by nvcc (C++17).
#pragma once

namespace strata::optim::detail {

// Adam/AdamW, per element, in this order (fma: one rounding where the ISA has FMA, see
// simd_io.h fmadd; the CUDA kernel uses __fmaf_rn):
//   g  = grad * grad_scale;            if l2: g = fma(p, l2_decay, g)
//   m' = fma(beta1, m, one_minus_beta1 * g)
//   v' = fma(beta2, v, one_minus_beta2 * (g * g))
//   d  = fma(sqrt(v'), inv_sqrt_bc2, eps)
//   p' = fma(m' / d, neg_step_size, p * decay)      decay = 1 - lr*wd (AdamW) or 1 (Adam)
struct AdamScalars {
  float grad_scale, beta1, one_minus_beta1, beta2, one_minus_beta2, eps;
  float inv_sqrt_bc2;   // 1 / sqrt(1 - beta2^step), or 1 without bias correction
  float neg_step_size;  // -lr / (1 - beta1^step), or -lr
  float decay;
  float l2_decay;
  bool l2;  // Adam with L2 weight decay (adamw_mode off, weight_decay > 0)
};

// Lion:  g = grad * grad_scale;  c = fma(beta1, m, one_minus_beta1 * g)
//        p' = fma(sign(c), neg_lr, p * decay);   m' = fma(beta2, m, one_minus_beta2 * g)
struct LionScalars {
  float grad_scale, beta1, one_minus_beta1, beta2, one_minus_beta2, neg_lr, decay;
};

// Adagrad: g = grad * grad_scale;  if l2: g = fma(p, l2_decay, g)
//          v' = fma(g, g, v);  p' = fma(g / (sqrt(v') + eps), neg_clr, p)
struct AdagradScalars {
  float grad_scale, eps, neg_clr, l2_decay;
  bool l2;
};

}  // namespace strata::optim::detail
