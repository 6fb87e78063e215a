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

// Blocks [b, e) of the shard. The shard and the kernel are copied in first: the codes are
// stored through byte pointers, which may alias anything reachable from a reference, so
// through references every block would reload the buffers' addresses and the kernel's
// constants.
template <class Kernel>
void q8_blocks(const Shard& shard, std::size_t b, std::size_t e, std::uint32_t salt, const Kernel& kernel) noexcept {
  static_assert(q8::kBlockElems % kLanes == 0, "a q8 block is whole batches");
  constexpr std::size_t kB = q8::kBlockElems;
  const Shard sh = shard;
  const Kernel k = kernel;
  const bool oop = sh.from[kMaster] != nullptr;
  auto* const master = static_cast<float*>(sh.base.ptr[kMaster]);
  const auto* const master_in = oop ? static_cast<const float*>(sh.from[kMaster]) : master;
  auto* const m_out = static_cast<std::uint8_t*>(sh.base.ptr[kM]);
  auto* const v_out = static_cast<std::uint8_t*>(sh.base.ptr[kV]);
  const auto* const m_in = static_cast<const std::uint8_t*>(oop ? sh.from[kM] : sh.base.ptr[kM]);
  const auto* const v_in = static_cast<const std::uint8_t*>(oop ? sh.from[kV] : sh.base.ptr[kV]);
  auto* const grad = static_cast<unsigned char*>(sh.base.ptr[kGrad]);
  auto* const copy = static_cast<unsigned char*>(sh.base.ptr[kCopy]);
  const std::size_t grad_bytes = kB * sh.elem_bytes[kGrad], copy_bytes = kB * sh.elem_bytes[kCopy];
  alignas(64) float m[kB], v[kB];
  Slots s;
  s.ptr[kM] = m_out ? m : nullptr;
  s.ptr[kV] = v_out ? v : nullptr;
  for (; b < e; ++b) {
    const std::size_t block = b * q8::kBlockBytes;
    if (m_out) q8simd::decode<false>(m_in + block, m);
    if (v_out) q8simd::decode<true>(v_in + block, v);
    if (oop) std::memcpy(master + b * kB, master_in + b * kB, sizeof(float) * kB);
    s.ptr[kMaster] = master + b * kB;
    s.ptr[kGrad] = grad + b * grad_bytes;
    s.ptr[kCopy] = copy ? copy + b * copy_bytes : nullptr;
    for (std::size_t j = 0; j < kB; j += kLanes) k.template apply<false>(s, j);
    if (m_out) q8simd::encode<false>(m, m_out + block, salt);
    if (v_out) q8simd::encode<true>(v, v_out + block, salt);
  }
}

template <class Kernel>
void run_q8(const Shard& sh, std::size_t n, std::size_t block_elems, std::uint32_t salt, const Kernel& kernel) {
  const std::size_t blocks = n / q8::kBlockElems;
  const std::size_t per_task = std::max<std::size_t>(1, block_elems / q8::kBlockElems);
  if (n < kParallelMinElems || blocks <= per_task) {
    q8_blocks(sh, 0, blocks, salt, kernel);
    return;
  }
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, blocks, per_task),
                    [&](const tbb::blocked_range<std::size_t>& r) { q8_blocks(sh, r.begin(), r.end(), salt, kernel); });
}

}  // namespace strata::optim::detail
