// The demo MLP's GPU arithmetic (mlp_cuda.cu): cuBLAS SGEMMs and a few small kernels on fp32
// device buffers, enqueued on the caller's CUDA stream. Row-major [rows, cols] everywhere,
// as on the host path: W is [H, H] (out, in), activations are [B, H]. Built without CUDA,
// every call throws Errc::unsupported.
#pragma once

#include <cstddef>

namespace strata::model::detail {

// A cuBLAS handle bound to `cuda_stream` (a cudaStream_t).
void* cuda_blas_create(void* cuda_stream);
void cuda_blas_destroy(void* handle) noexcept;

// out = act(in · W^T + b), act = tanh or identity.
void cuda_mlp_forward(void* handle, void* cuda_stream, const float* W, const float* b, const float* in, float* out,
                      std::size_t batch, std::size_t hidden, bool tanh_act);

// From dout = dL/d(out) (overwritten with dL/dz): dW = dz^T · in, db = column sums of dz (in
// sample order), din = dz · W.
void cuda_mlp_backward(void* handle, void* cuda_stream, const float* W, const float* in, const float* out, float* dout,
                       float* dW, float* db, float* din, std::size_t batch, std::size_t hidden, bool tanh_act);

}  // namespace strata::model::detail
