// kernel_info.h, answered by the same xsimd configuration the kernels see.
#include "optim/kernel_info.h"

#include "optim/detail/simd_io.h"

namespace strata::optim {

const char* kernel_isa() noexcept { return xsimd::default_arch::name(); }

bool kernel_fused_fma() noexcept {
  return XSIMD_WITH_AVX512F || XSIMD_WITH_FMA3_SSE || XSIMD_WITH_FMA3_AVX || XSIMD_WITH_FMA3_AVX2;
}

}  // namespace strata::optim
