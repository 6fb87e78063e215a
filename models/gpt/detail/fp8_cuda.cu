// FP8 quantization kernels and the cuBLASLt FP8 product (see fp8_cuda.h).
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "models/detail/cublas_api.h"
#include "models/gpt/detail/fp8_cuda.h"
#include "runtime/core/error.h"
#include "runtime/device/cuda_check.h"

namespace strata::model::detail {
namespace {

void lt_check(cublasStatus_t s, const char* what) {
  STRATA_CHECK(s == CUBLAS_STATUS_SUCCESS, Errc::cuda, "cuBLASLt ", what, " failed: ", cublas().status_string(s));
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

__device__ unsigned int abs_bits(float x) { return __float_as_uint(x) & 0x7fffffffu; }

__device__ std::uint8_t encode(float x, float s, bool e4m3) {
  return __nv_cvt_float_to_fp8(__fmul_rn(x, s), __NV_SATFINITE, e4m3 ? __NV_E4M3 : __NV_E5M2);
}

// One atomic per warp: the lanes' largest bits first.
__device__ void warp_amax(unsigned int local, unsigned int* amax_bits) {
  for (int o = 16; o > 0; o >>= 1) local = max(local, __shfl_xor_sync(0xffffffffu, local, o));
  if ((threadIdx.x + threadIdx.y * blockDim.x) % 32 == 0) atomicMax(amax_bits, local);
}

// Non-negative floats order as their bit patterns, and a NaN's (sign cleared) above +inf's.
__global__ void quantize_kernel(const float* in, std::uint8_t* out, std::size_t n, bool e4m3, const float* scale,
                                unsigned int* amax_bits) {
  const float s = *scale;
  unsigned int local = 0;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float x = in[i];
    local = max(local, abs_bits(x));
    out[i] = encode(x, s, e4m3);
  }
  warp_amax(local, amax_bits);
}

__global__ void fake_quantize_kernel(const float* in, float* out, std::size_t n, bool e4m3, const float* scale,
                                     unsigned int* amax_bits) {
  const float s = *scale;
  unsigned int local = 0;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float x = in[i];
    local = max(local, abs_bits(x));
    const __half_raw h = __nv_cvt_fp8_to_halfraw(encode(x, s, e4m3), e4m3 ? __NV_E4M3 : __NV_E5M2);
    out[i] = __fdiv_rn(__half2float(__half(h)), s);
  }
  warp_amax(local, amax_bits);
}

__global__ void amax_kernel(const float* in, std::size_t n, unsigned int* amax_bits) {
  unsigned int local = 0;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    local = max(local, abs_bits(in[i]));
  warp_amax(local, amax_bits);
}

// A 32 x 32 tile per block of 32 x 8 threads: read along rows, written along columns.
constexpr int kTileDim = 32, kTileRows = 8;
__global__ void quantize_transposed_kernel(const float* in, int rows, int cols, std::uint8_t* out, bool e4m3,
                                           const float* scale, unsigned int* amax_bits) {
  __shared__ std::uint8_t tile[kTileDim][kTileDim + 1];
  const float s = *scale;
  const int c0 = blockIdx.x * kTileDim, r0 = blockIdx.y * kTileDim;
  unsigned int local = 0;
  for (int j = threadIdx.y; j < kTileDim; j += kTileRows) {
    const int r = r0 + j, c = c0 + threadIdx.x;
    if (r < rows && c < cols) {
      const float x = in[static_cast<std::size_t>(r) * cols + c];
      local = max(local, abs_bits(x));
      tile[j][threadIdx.x] = encode(x, s, e4m3);
    }
  }
  __syncthreads();
  for (int j = threadIdx.y; j < kTileDim; j += kTileRows) {
    const int c = c0 + j, r = r0 + threadIdx.x;
    if (c < cols && r < rows) out[static_cast<std::size_t>(c) * rows + r] = tile[threadIdx.x][j];
  }
  warp_amax(local, amax_bits);
}

__global__ void set_scale_kernel(float* scale, float* inverse, float value) {
  *scale = value;
  *inverse = 1.0f / value;
}

void check_fmt(DType fmt, const char* what) {
  STRATA_CHECK(fmt == DType::fp8_e4m3 || fmt == DType::fp8_e5m2, Errc::invalid_argument, what, ": ", dtype_name(fmt),
               " is not fp8_e4m3 or fp8_e5m2");
}

// The largest power of two up to 256 that divides p's address.
std::uint32_t alignment(const void* p) {
  std::uint32_t a = 256;
  while (a > 1 && reinterpret_cast<std::uintptr_t>(p) % a != 0) a /= 2;
  return a;
}

struct Layouts {
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Layouts() {
    if (pref) cublas().lt_pref_destroy(pref);
    if (op) cublas().lt_desc_destroy(op);
    if (c) cublas().lt_layout_destroy(c);
    if (b) cublas().lt_layout_destroy(b);
    if (a) cublas().lt_layout_destroy(a);
  }
};

}  // namespace

void* fp8_lt_create() {
  cublasLtHandle_t h = nullptr;
  lt_check(cublas().lt_create(&h), "create (is a GPU present?)");
  return h;
}

void fp8_lt_destroy(void* handle) noexcept {
  if (handle != nullptr) cublas().lt_destroy(static_cast<cublasLtHandle_t>(handle));
}

void cuda_fp8_quantize(void* cuda_stream, const float* in, void* out, std::size_t n, DType fmt, const float* scale,
                       float* amax) {
  check_fmt(fmt, "fp8 quantize");
  if (n == 0) return;
  auto* stream = static_cast<cudaStream_t>(cuda_stream);
  constexpr int kThreads = 256;
  quantize_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(
      in, static_cast<std::uint8_t*>(out), n, fmt == DType::fp8_e4m3, scale, reinterpret_cast<unsigned int*>(amax));
  STRATA_CUDA_CHECK(cudaGetLastError(), "fp8 quantize kernel launch");
}

void cuda_fp8_quantize_transposed(void* cuda_stream, const float* in, int rows, int cols, void* out, DType fmt,
                                  const float* scale, float* amax) {
  check_fmt(fmt, "fp8 quantize (transposed)");
  if (rows <= 0 || cols <= 0) return;
  const dim3 grid((cols + kTileDim - 1) / kTileDim, (rows + kTileDim - 1) / kTileDim), block(kTileDim, kTileRows);
  quantize_transposed_kernel<<<grid, block, 0, static_cast<cudaStream_t>(cuda_stream)>>>(
      in, rows, cols, static_cast<std::uint8_t*>(out), fmt == DType::fp8_e4m3, scale,
      reinterpret_cast<unsigned int*>(amax));
  STRATA_CUDA_CHECK(cudaGetLastError(), "fp8 transposed quantize kernel launch");
}

void cuda_fp8_fake_quantize(void* cuda_stream, const float* in, float* out, std::size_t n, DType fmt,
                            const float* scale, float* amax) {
  check_fmt(fmt, "fp8 fake quantize");
  if (n == 0) return;
  constexpr int kThreads = 256;
  fake_quantize_kernel<<<grid_for(n, kThreads), kThreads, 0, static_cast<cudaStream_t>(cuda_stream)>>>(
      in, out, n, fmt == DType::fp8_e4m3, scale, reinterpret_cast<unsigned int*>(amax));
  STRATA_CUDA_CHECK(cudaGetLastError(), "fp8 fake quantize kernel launch");
}

void cuda_fp8_amax(void* cuda_stream, const float* in, std::size_t n, float* amax) {
  if (n == 0) return;
  constexpr int kThreads = 256;
  amax_kernel<<<grid_for(n, kThreads), kThreads, 0, static_cast<cudaStream_t>(cuda_stream)>>>(
      in, n, reinterpret_cast<unsigned int*>(amax));
  STRATA_CUDA_CHECK(cudaGetLastError(), "fp8 amax kernel launch");
}

void cuda_fp8_set_scale(void* cuda_stream, float* scale, float* inverse, float value) {
  set_scale_kernel<<<1, 1, 0, static_cast<cudaStream_t>(cuda_stream)>>>(scale, inverse, value);
  STRATA_CUDA_CHECK(cudaGetLastError(), "fp8 scale kernel launch");
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
  lt_check(cublas().lt_desc_create(&l.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul desc");
  const cublasOperation_t trans = CUBLAS_OP_T, no = CUBLAS_OP_N;
  lt_check(cublas().lt_desc_set(l.op, CUBLASLT_MATMUL_DESC_TRANSA, &trans, sizeof trans), "transa");
  lt_check(cublas().lt_desc_set(l.op, CUBLASLT_MATMUL_DESC_TRANSB, &no, sizeof no), "transb");
  // cuBLASLt's "A" is our B and its "B" our A: their dequantization scales swap alike.
  lt_check(cublas().lt_desc_set(l.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &b_scale_inv, sizeof b_scale_inv),
           "A scale");
  lt_check(cublas().lt_desc_set(l.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a_scale_inv, sizeof a_scale_inv),
           "B scale");
  lt_check(cublas().lt_layout_create(&l.a, bt, K, N, K), "layout of B");
  lt_check(cublas().lt_layout_create(&l.b, at, K, M, K), "layout of A");
  lt_check(cublas().lt_layout_create(&l.c, CUDA_R_32F, N, M, N), "layout of C");
  lt_check(cublas().lt_pref_create(&l.pref), "preference");
  lt_check(
      cublas().lt_pref_set(l.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes, sizeof workspace_bytes),
      "workspace preference");
  // The heuristic assumes 256-byte aligned matrices unless told, and the kernel it picks then
  // refuses (NOT_SUPPORTED) operands inside larger buffers: say what they are.
  const std::uint32_t align_a = alignment(B), align_b = alignment(A), align_c = alignment(C);
  for (auto [attr, v] : {std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a},
                         std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b},
                         std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c},
                         std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_c}})
    lt_check(cublas().lt_pref_set(l.pref, attr, &v, sizeof v), "alignment preference");
  auto* h = static_cast<cublasLtHandle_t>(handle);
  cublasLtMatmulHeuristicResult_t algo{};
  int found = 0;
  lt_check(cublas().lt_heuristic(h, l.op, l.a, l.b, l.c, l.c, l.pref, 1, &algo, &found), "heuristic");
  STRATA_CHECK(found > 0, Errc::unsupported, "fp8 gemm: cuBLASLt offers no FP8 kernel for ", M, " x ", N, " x ", K,
               " (", dtype_name(a_fmt), " x ", dtype_name(b_fmt), ") on this GPU: FP8 needs compute capability 8.9+");
  const cublasStatus_t done = cublas().lt_matmul(h, l.op, &alpha, B, l.a, A, l.b, &beta, C, l.c, C, l.c, &algo.algo,
                                                 workspace, workspace_bytes, static_cast<cudaStream_t>(cuda_stream));
  STRATA_CHECK(done == CUBLAS_STATUS_SUCCESS, Errc::cuda, "cuBLASLt FP8 matmul ", M, " x ", N, " x ", K, " (",
               dtype_name(a_fmt), " x ", dtype_name(b_fmt), ", beta ", beta, ", alignment of A ", align_b, " B ",
               align_a, " C ", align_c, " and of the scales ", alignment(a_scale_inv), " and ", alignment(b_scale_inv),
               ") failed: ", cublas().status_string(done));
}

}  // namespace strata::model::detail
