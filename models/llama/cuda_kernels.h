// The Llama family's kernels on a CUDA device (see kernels.h): CudaLlamaKernels owns a stream
// (or uses the one it is given, which must outlive it), the GPT's CUDA kernels on that stream
// (the head, the loss, elementwise work), a cuBLAS handle bound to it, and its scratch (token
// ids, the embedding gradient's grouping, the attention scores' gradient); it enqueues
// detail/llama_cuda.h's arithmetic and the GPT's products (models/gpt/detail/gpt_cuda.h).
// Built without CUDA, making them throws Errc::unsupported.
#pragma once

#include <cstddef>
#include <memory>

#include "models/llama/kernels.h"

namespace strata::model {

std::unique_ptr<LlamaKernels> make_cuda_llama_kernels(device::Device& dev, int max_tokens, std::size_t max_att,
                                                      device::Stream* stream = nullptr);

}  // namespace strata::model
