// The GPT's kernels on a CUDA device (see kernels.h): CudaKernels owns a stream (or uses
// the one it is given, which must outlive it), a cuBLAS handle bound to it and its scratch
// (token ids, the embedding gradient's grouping, the attention scores' gradient), and
// enqueues detail/gpt_cuda.h's arithmetic. Built without CUDA, making them throws
// Errc::unsupported.
#pragma once

#include <cstddef>
#include <memory>

#include "models/gpt/kernels.h"

namespace strata::model {

std::unique_ptr<GptKernels> make_cuda_kernels(device::Device& dev, int max_tokens, std::size_t max_att,
                                              device::Stream* stream = nullptr);

}  // namespace strata::model
