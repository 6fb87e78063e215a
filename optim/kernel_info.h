// What the CPU kernels were compiled for: the SIMD instruction set (chosen at build time by
// STRATA_ARCH) and whether their fused multiply-adds round once. Reported by `strata bench
// adam`; the tests use it to pick the rounding bound of a multiply-add.
#pragma once

namespace strata::optim {

const char* kernel_isa() noexcept;  // "avx512bw", "fma3<avx2>", "sse2", ...
bool kernel_fused_fma() noexcept;   // false on ISAs without FMA (two roundings)

}  // namespace strata::optim
