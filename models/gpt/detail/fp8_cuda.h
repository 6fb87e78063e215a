// The FP8 products' GPU side: what fp8_products.h simulates on the host, on FP8 tensor cores
// (Hopper and later) through cuBLASLt. Quantization encodes fp32 to E4M3 or E5M2 codes at a
// power-of-two scale (nearest even, saturating at the format's largest finite value, NaN kept:
// fp8::fake_quantize's rounding) and records the tensor's amax; the product multiplies two
// K-major FP8 operands with their dequantization scales (1 / scale) and sums in fp32, as
// cuBLASLt's FP8 kernels require ("TN": both operands with K contiguous). Every call is
// enqueued on the caller's CUDA stream; pointers are device memory. Built without CUDA,
// every call throws Errc::unsupported.
#pragma once

#include <cstddef>

#include "runtime/core/dtype.h"

namespace strata::model::detail {

// A cuBLASLt handle.
void* fp8_lt_create();
void fp8_lt_destroy(void* handle) noexcept;

// out[i] = the fmt code of in[i] * (*scale) (fmt: fp8_e4m3 or fp8_e5m2), and *amax = max(*amax,
// max |in[i]|) (NaN when one is NaN): the caller zeroes *amax where a step begins.
void cuda_fp8_quantize(void* cuda_stream, const float* in, void* out, std::size_t n, DType fmt, const float* scale,
                       float* amax);

// The same for a rows x cols matrix, written transposed: out[c * rows + r] is the code of
// in[r * cols + c] (an operand whose K ran along rows, made K-major for cuda_fp8_gemm).
void cuda_fp8_quantize_transposed(void* cuda_stream, const float* in, int rows, int cols, void* out, DType fmt,
                                  const float* scale, float* amax);
// out[i] = the fp32 value of in[i]'s code divided by *scale (fp8::fake_quantize on the GPU,
// bit for bit), and *amax as above: for products cuBLASLt's FP8 kernels cannot take.
void cuda_fp8_fake_quantize(void* cuda_stream, const float* in, float* out, std::size_t n, DType fmt,
                            const float* scale, float* amax);
// *amax = max(*amax, max |in[i]|) alone.
void cuda_fp8_amax(void* cuda_stream, const float* in, std::size_t n, float* amax);

// *scale = value and *inverse = 1 / value (a power of two: exact), in stream order.
void cuda_fp8_set_scale(void* cuda_stream, float* scale, float* inverse, float value);

// C[M,N] = alpha (a_scale_inv A) (b_scale_inv B)^T + beta C, row-major: A is [M,K] and B is
// [N,K] FP8 codes (K contiguous in both), C fp32; a_scale_inv and b_scale_inv point to one
// float each. M, N and K must be multiples of 16 and A, B, C 16-byte aligned (cuBLASLt's FP8
// rules); E5M2 x E5M2 is not offered (cuBLASLt has no such kernel). workspace may be null.
void cuda_fp8_gemm(void* handle, void* cuda_stream, int M, int N, int K, const void* A, DType a_fmt,
                   const float* a_scale_inv, const void* B, DType b_fmt, const float* b_scale_inv, float alpha,
                   float beta, float* C, void* workspace, std::size_t workspace_bytes);

}  // namespace strata::model::detail
