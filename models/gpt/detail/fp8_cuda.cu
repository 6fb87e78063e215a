// FP8 quantization kernels and the cuBLASLt FP8 product (see fp8_cuda.h).
#include <cublasLt.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "models/gpt/detail/fp8_cuda.h"
#include "runtime/core/error.h"
#include "runtime/device/cuda_check.h"

namespace strata::model::detail {
namespace {

void lt_check(cublasStatus_t s, const char* what) {
  STRATA_CHECK(s == CUBLAS_STATUS_SUCCESS, Errc::cuda, "cuBLASLt ", what, " failed: ", cublasGetStatusString(s));
}

cudaDataType_t fp8_type(DType fmt, const char* operand) {
  STRATA_CHECK(fmt == DType::fp8_e4m3 || fmt == DType::fp8_e5m2, Errc::invalid_argument, "fp8 gemm: operand ", operand,
               " is ", dtype_name(fmt), ", not fp8_e4m3 or fp8_e5m2");
  return fmt == DType::fp8_e4m3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
}

int grid_for(std::size_t n, int threads) {
  const std::size_t blocks = (n + threads - 1) / threads;
  return static_cast<int>(blocks < 4096 ? blocks : 4096);
}

// Non-negative floats order as their bit patterns, and a NaN's (sign cleared) above +inf's.
__global__ void quantize_kernel(const float* in, std::uint8_t* out, std::size_t n, bool e4m3, const float* scale,
                                unsigned int* amax_bits) {
  const float s = *scale;
  unsigned int local = 0;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float x = in[i];
    local = max(local, __float_as_uint(x) & 0x7fffffffu);
    out[i] = __nv_cvt_float_to_fp8(__fmul_rn(x, s), __NV_SATFINITE, e4m3 ? __NV_E4M3 : __NV_E5M2);
  }
  atomicMax(amax_bits, local);
}

struct Layouts {
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Layouts() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (op) cublasLtMatmulDescDestroy(op);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
  }
};

}  // namespace

void* fp8_lt_create() {
  cublasLtHandle_t h = nullptr;
  lt_check(cublasLtCreate(&h), "create (is a GPU present?)");
  return h;
}

void fp8_lt_destroy(void* handle) noexcept {
  if (handle != nullptr) cublasLtDestroy(static_cast<cublasLtHandle_t>(handle));
}

void cuda_fp8_quantize(void* cuda_stream, const float* in, void* out, std::size_t n, DType fmt, const float* scale,
                       float* amax) {
  STRATA_CHECK(fmt == DType::fp8_e4m3 || fmt == DType::fp8_e5m2, Errc::invalid_argument,
               "fp8 quantize: ", dtype_name(fmt), " is not fp8_e4m3 or fp8_e5m2");
  if (n == 0) return;
  auto* stream = static_cast<cudaStream_t>(cuda_stream);
  constexpr int kThreads = 256;
  quantize_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(
      in, static_cast<std::uint8_t*>(out), n, fmt == DType::fp8_e4m3, scale, reinterpret_cast<unsigned int*>(amax));
  STRATA_CUDA_CHECK(cudaGetLastError(), "fp8 quantize kernel launch");
}

void cuda_fp8_gemm(void* handle, void* cuda_stream, int M, int N, int K, const void* A, DType a_fmt,
                   const float* a_scale_inv, const void* B, DType b_fmt, const float* b_scale_inv, float alpha,
                   float beta, float* C, void* workspace, std::size_t workspace_bytes) {
  STRATA_CHECK(M > 0 && N > 0 && K > 0 && M % 16 == 0 && N % 16 == 0 && K % 16 == 0, Errc::invalid_argument,
               "fp8 gemm: ", M, " x ", N, " x ", K, ": cuBLASLt's FP8 kernels need every dimension a multiple of 16");
  for (const void* p : {A, B, static_cast<const void*>(C)})
    STRATA_CHECK(reinterpret_cast<std::uintptr_t>(p) % 16 == 0, Errc::invalid_argument,
                 "fp8 gemm: operands must be 16-byte aligned");
  STRATA_CHECK(!(a_fmt == DType::fp8_e5m2 && b_fmt == DType::fp8_e5m2), Errc::invalid_argument,
               "fp8 gemm: E5M2 x E5M2 has no cuBLASLt kernel: quantize one operand to E4M3");
  // Column-major view: C^T [N, M] = B [N, K] (stored K x N, transposed) x A^T (stored K x M).
  Layouts l;
  const cudaDataType_t at = fp8_type(a_fmt, "A"), bt = fp8_type(b_fmt, "B");
  lt_check(cublasLtMatmulDescCreate(&l.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul desc");
  const cublasOperation_t trans = CUBLAS_OP_T, no = CUBLAS_OP_N;
  lt_check(cublasLtMatmulDescSetAttribute(l.op, CUBLASLT_MATMUL_DESC_TRANSA, &trans, sizeof trans), "transa");
  lt_check(cublasLtMatmulDescSetAttribute(l.op, CUBLASLT_MATMUL_DESC_TRANSB, &no, sizeof no), "transb");
  // cuBLASLt's "A" is our B and its "B" our A: their dequantization scales swap alike.
  lt_check(cublasLtMatmulDescSetAttribute(l.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &b_scale_inv, sizeof b_scale_inv),
           "A scale");
  lt_check(cublasLtMatmulDescSetAttribute(l.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a_scale_inv, sizeof a_scale_inv),
           "B scale");
  lt_check(cublasLtMatrixLayoutCreate(&l.a, bt, K, N, K), "layout of B");
  lt_check(cublasLtMatrixLayoutCreate(&l.b, at, K, M, K), "layout of A");
  lt_check(cublasLtMatrixLayoutCreate(&l.c, CUDA_R_32F, N, M, N), "layout of C");
  lt_check(cublasLtMatmulPreferenceCreate(&l.pref), "preference");
  lt_check(cublasLtMatmulPreferenceSetAttribute(l.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                                sizeof workspace_bytes),
           "workspace preference");
  auto* h = static_cast<cublasLtHandle_t>(handle);
  cublasLtMatmulHeuristicResult_t algo{};
  int found = 0;
  lt_check(cublasLtMatmulAlgoGetHeuristic(h, l.op, l.a, l.b, l.c, l.c, l.pref, 1, &algo, &found), "heuristic");
  STRATA_CHECK(found > 0, Errc::unsupported, "fp8 gemm: cuBLASLt offers no FP8 kernel for ", M, " x ", N, " x ", K,
               " (", dtype_name(a_fmt), " x ", dtype_name(b_fmt), ") on this GPU: FP8 needs compute capability 8.9+");
  lt_check(cublasLtMatmul(h, l.op, &alpha, B, l.a, A, l.b, &beta, C, l.c, C, l.c, &algo.algo, workspace,
                          workspace_bytes, static_cast<cudaStream_t>(cuda_stream)),
           "matmul");
}

}  // namespace strata::model::detail
