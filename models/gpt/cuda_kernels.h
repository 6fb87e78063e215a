// The GPT's kernels on a CUDA device (see kernels.h): CudaKernels owns a stream (or uses
// the one it is given, which must outlive it), a cuBLAS handle bound to it and its scratch
// (token ids, the embedding gradient's grouping, the attention scores' gradient), and
// enqueues detail/gpt_cuda.h's arithmetic. Built without CUDA, making them throws
// Errc::unsupported.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "models/gpt/kernels.h"

namespace strata::model {

// An embedding gradient's grouping of rows by token, as a GPU kernel walks it without atomics:
// the rows stably sorted by token (so ascending within a token), the start of each token's
// segment (segments + 1 of them, the last N) and each segment's token, packed as
// [order | starts | tokens] to upload at once. The Llama's CUDA kernels use it too.
struct TokenGroups {
  std::vector<std::int32_t> packed;
  int segments = 0;
};
TokenGroups group_rows_by_token(const std::int32_t* tokens, int N);

std::unique_ptr<GptKernels> make_cuda_kernels(device::Device& dev, int max_tokens, std::size_t max_att,
                                              device::Stream* stream = nullptr);

}  // namespace strata::model
