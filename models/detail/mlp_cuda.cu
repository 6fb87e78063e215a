// The demo MLP on the GPU (see mlp_cuda.h). cuBLAS is column-major: a row-major [r, c]
// buffer is the column-major [c, r] matrix, so each product below is written on the
// transposes. FP32 math mode: no TF32, so the only difference from the host path is the
// order of the sums.
#include <cuda_runtime.h>

#include "models/detail/cublas_api.h"
#include "models/detail/mlp_cuda.h"
#include "runtime/core/error.h"
#include "runtime/device/cuda_check.h"

namespace strata::model::detail {
namespace {

void blas_check(cublasStatus_t s, const char* what) {
  STRATA_CHECK(s == CUBLAS_STATUS_SUCCESS, Errc::cuda, "cuBLAS ", what, " failed: ", cublas().status_string(s));
}

int grid_for(std::size_t n, int threads) {
  const std::size_t blocks = (n + threads - 1) / threads;
  return static_cast<int>(blocks < 65535 ? blocks : 65535);
}

__global__ void bias_act_kernel(float* out, const float* b, std::size_t n, std::size_t hidden, bool tanh_act) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float z = __fadd_rn(out[i], b[i % hidden]);
    out[i] = tanh_act ? tanhf(z) : z;
  }
}

// dz = dout * (1 - out^2) through tanh.
__global__ void tanh_grad_kernel(float* dout, const float* out, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    dout[i] = __fmul_rn(dout[i], __fsub_rn(1.0f, __fmul_rn(out[i], out[i])));
  }
}

// db[o] = sum over samples of dz[s, o], in sample order: one thread per output.
__global__ void column_sum_kernel(const float* dz, float* db, std::size_t batch, std::size_t hidden) {
  for (std::size_t o = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; o < hidden;
       o += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    float acc = 0.0f;
    for (std::size_t s = 0; s < batch; ++s) acc = __fadd_rn(acc, dz[s * hidden + o]);
    db[o] = acc;
  }
}

}  // namespace

void* cuda_blas_create(void* cuda_stream) {
  cublasHandle_t h = nullptr;
  blas_check(cublas().create(&h), "create (is a GPU present?)");
  const cublasStatus_t s1 = cublas().set_stream(h, static_cast<cudaStream_t>(cuda_stream));
  const cublasStatus_t s2 = cublas().set_math_mode(h, CUBLAS_DEFAULT_MATH);
  if (s1 != CUBLAS_STATUS_SUCCESS || s2 != CUBLAS_STATUS_SUCCESS) {
    cublas().destroy(h);
    blas_check(s1 != CUBLAS_STATUS_SUCCESS ? s1 : s2, "stream/math mode");
  }
  return h;
}

void cuda_blas_destroy(void* handle) noexcept {
  if (handle != nullptr) cublas().destroy(static_cast<cublasHandle_t>(handle));
}

void cuda_mlp_forward(void* handle, void* cuda_stream, const float* W, const float* b, const float* in, float* out,
                      std::size_t batch, std::size_t hidden, bool tanh_act) {
  auto h = static_cast<cublasHandle_t>(handle);
  const int H = static_cast<int>(hidden), B = static_cast<int>(batch);
  const float one = 1.0f, zero = 0.0f;
  // out^T [H, B] = W [H, H] · in^T [H, B]; W's buffer is W^T column-major, so op = T.
  blas_check(cublas().sgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, H, B, H, &one, W, H, in, H, &zero, out, H), "forward sgemm");
  const std::size_t n = batch * hidden;
  bias_act_kernel<<<grid_for(n, 256), 256, 0, static_cast<cudaStream_t>(cuda_stream)>>>(out, b, n, hidden, tanh_act);
  STRATA_CUDA_CHECK(cudaGetLastError(), "mlp bias/activation kernel");
}

void cuda_mlp_backward(void* handle, void* cuda_stream, const float* W, const float* in, const float* out, float* dout,
                       float* dW, float* db, float* din, std::size_t batch, std::size_t hidden, bool tanh_act) {
  auto h = static_cast<cublasHandle_t>(handle);
  auto st = static_cast<cudaStream_t>(cuda_stream);
  const int H = static_cast<int>(hidden), B = static_cast<int>(batch);
  const float one = 1.0f, zero = 0.0f;
  const std::size_t n = batch * hidden;
  if (tanh_act) {
    tanh_grad_kernel<<<grid_for(n, 256), 256, 0, st>>>(dout, out, n);
    STRATA_CUDA_CHECK(cudaGetLastError(), "mlp tanh gradient kernel");
  }
  // dW^T [H(in), H(out)] = in^T [H, B] · dz [B, H]: dz's buffer is dz^T column-major, op = T.
  blas_check(cublas().sgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, H, H, B, &one, in, H, dout, H, &zero, dW, H),
             "weight-gradient sgemm");
  column_sum_kernel<<<grid_for(hidden, 128), 128, 0, st>>>(dout, db, batch, hidden);
  STRATA_CUDA_CHECK(cudaGetLastError(), "mlp bias-gradient kernel");
  // din^T [H, B] = W^T [H, H] · dz^T [H, B]: W's buffer is W^T column-major, op = N.
  blas_check(cublas().sgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, H, B, H, &one, W, H, dout, H, &zero, din, H),
             "input-gradient sgemm");
}

}  // namespace strata::model::detail
