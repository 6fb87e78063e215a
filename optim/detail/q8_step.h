// The driver for optimizer kernels over q8 moments (runtime/core/q8_codec.h). The shard is
// cut into runs of whole 16-element blocks handed to TBB; each block's moments are decoded to
// fp32 lanes, the fp32 kernel runs on them (the same arithmetic, in the same order, as for
// fp32 moments), and the new moments are coded back with the step as salt (q8_simd.h: the
// codec in vector lanes). Every block is a
// pure function of its own bytes, so results do not depend on how blocks meet threads.
//
// Protocol: as block_loop.h's (the caller validates first; nothing throws inside), with
// n a multiple of 16 and the kernel one of fp32 moments. Out of place (Shard::from): the
// master and the moments are read from there.
#pragma once

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "optim/detail/block_loop.h"
#include "optim/detail/q8_simd.h"
#include "runtime/core/q8_codec.h"

namespace strata::optim::detail {

// One block of 16 elements starting at element i (a multiple of 16).
template <class Kernel>
void q8_block(const Shard& sh, std::size_t i, std::uint32_t salt, const Kernel& kernel) noexcept {
  static_assert(q8::kBlockElems % kLanes == 0, "a q8 block is whole batches");
  alignas(64) float m[q8::kBlockElems], v[q8::kBlockElems];
  const std::size_t block = i / q8::kBlockElems * q8::kBlockBytes;
  auto bytes = [&](const void* p) { return static_cast<const std::uint8_t*>(p) + block; };
  const bool oop = sh.from[kMaster] != nullptr;
  if (sh.base.ptr[kM]) q8simd::decode<false>(bytes(oop ? sh.from[kM] : sh.base.ptr[kM]), m);
  if (sh.base.ptr[kV]) q8simd::decode<true>(bytes(oop ? sh.from[kV] : sh.base.ptr[kV]), v);
  if (oop)
    std::memcpy(static_cast<float*>(sh.base.ptr[kMaster]) + i, static_cast<const float*>(sh.from[kMaster]) + i,
                sizeof(float) * q8::kBlockElems);
  Slots s;
  for (int k : {kMaster, kGrad, kCopy})
    if (sh.base.ptr[k]) s.ptr[k] = static_cast<unsigned char*>(sh.base.ptr[k]) + i * sh.elem_bytes[k];
  s.ptr[kM] = sh.base.ptr[kM] ? m : nullptr;
  s.ptr[kV] = sh.base.ptr[kV] ? v : nullptr;
  for (std::size_t j = 0; j < q8::kBlockElems; j += kLanes) kernel.template apply<false>(s, j);
  auto out = [&](void* p) { return static_cast<std::uint8_t*>(p) + block; };
  if (sh.base.ptr[kM]) q8simd::encode<false>(m, out(sh.base.ptr[kM]), salt);
  if (sh.base.ptr[kV]) q8simd::encode<true>(v, out(sh.base.ptr[kV]), salt);
}

template <class Kernel>
void run_q8(const Shard& sh, std::size_t n, std::size_t block_elems, std::uint32_t salt, const Kernel& kernel) {
  const std::size_t blocks = n / q8::kBlockElems;
  const std::size_t per_task = std::max<std::size_t>(1, block_elems / q8::kBlockElems);
  auto range = [&](std::size_t b, std::size_t e) {
    for (; b < e; ++b) q8_block(sh, b * q8::kBlockElems, salt, kernel);
  };
  if (n < kParallelMinElems || blocks <= per_task) {
    range(0, blocks);
    return;
  }
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, blocks, per_task),
                    [&](const tbb::blocked_range<std::size_t>& r) { range(r.begin(), r.end()); });
}

}  // namespace strata::optim::detail
