// The elementwise driver under every CPU optimizer kernel. A shard of n elements is cut into
// fixed blocks (StepOptions::block_elems) handed to TBB; inside a block the interior runs in
// full batches aligned for the kernel's streaming store, and the ragged head and tail go
// through a zero-padded scratch batch. Every element thus takes the identical vector
// arithmetic, so results do not depend on block size, alignment or thread count.
//
// Protocol: the caller validates everything first (kernels cannot fail and nothing may throw
// inside a TBB body), then calls run_elementwise(shard, n, block_elems, kernel). A Kernel has
//   template <bool kNonTemporal> void apply(const Slots& s, std::size_t i) const noexcept;
// which reads and writes elements i..i+kLanes-1 of the non-null slots; with kNonTemporal it
// may use streaming stores on the slot named by Shard::align_slot. A slot with Shard::from
// set gets each block's old values copied in from there just before the block runs.
#pragma once

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "optim/detail/simd_io.h"

namespace strata::optim::detail {

enum Slot : int { kMaster = 0, kGrad, kM, kV, kCopy, kSlotCount };

struct Slots {
  void* ptr[kSlotCount] = {};
};

struct Shard {
  Slots base;                               // element 0 of each buffer; nullptr if unused
  std::size_t elem_bytes[kSlotCount] = {};  // storage bytes per element of each slot
  bool written[kSlotCount] = {};            // slots the kernel stores to
  int align_slot = -1;                      // slot whose batches are aligned (streamed), or -1
  const void* from[kSlotCount] = {};        // out of place: where a written slot's old values are
};

// Elements at the front of [i, end) to run padded so that the aligned slot's address of the
// next element is a multiple of its batch bytes.
inline std::size_t head_elems(const Shard& sh, std::size_t i, std::size_t end) noexcept {
  if (sh.align_slot < 0) return 0;
  const std::size_t eb = sh.elem_bytes[sh.align_slot];
  const std::size_t batch_bytes = kLanes * eb;
  const auto addr = reinterpret_cast<std::uintptr_t>(sh.base.ptr[sh.align_slot]) + i * eb;
  const std::size_t mis = addr % batch_bytes;
  const std::size_t head = mis == 0 ? 0 : (batch_bytes - mis) / eb;
  return std::min(head, end - i);
}

// Runs `len` (< one batch) elements starting at i through the kernel on zero-padded copies.
template <class Kernel>
void apply_padded(const Shard& sh, std::size_t i, std::size_t len, const Kernel& kernel) noexcept {
  alignas(64) unsigned char scratch[kSlotCount][kLanes * sizeof(float)];
  Slots tmp;
  for (int s = 0; s < kSlotCount; ++s) {
    if (!sh.base.ptr[s]) continue;
    const std::size_t eb = sh.elem_bytes[s];
    std::memset(scratch[s], 0, sizeof scratch[s]);
    std::memcpy(scratch[s], static_cast<const unsigned char*>(sh.base.ptr[s]) + i * eb, len * eb);
    tmp.ptr[s] = scratch[s];
  }
  kernel.template apply<false>(tmp, 0);
  for (int s = 0; s < kSlotCount; ++s) {
    if (!sh.base.ptr[s] || !sh.written[s]) continue;
    const std::size_t eb = sh.elem_bytes[s];
    std::memcpy(static_cast<unsigned char*>(sh.base.ptr[s]) + i * eb, scratch[s], len * eb);
  }
}

template <class Kernel>
void run_range(const Shard& sh, std::size_t begin, std::size_t end, const Kernel& kernel) noexcept {
  // Out of place: the range's old values first (a block: they stay in cache for the kernel).
  for (int s = 0; s < kSlotCount; ++s) {
    if (sh.from[s] == nullptr) continue;
    const std::size_t eb = sh.elem_bytes[s];
    std::memcpy(static_cast<unsigned char*>(sh.base.ptr[s]) + begin * eb,
                static_cast<const unsigned char*>(sh.from[s]) + begin * eb, (end - begin) * eb);
  }
  std::size_t i = begin;
  const std::size_t head = head_elems(sh, i, end);
  if (head) apply_padded(sh, i, head, kernel);
  i += head;
  // Local copies: the stores through the buffers cannot alias them, so the pointers and the
  // kernel's constants stay in registers instead of being reloaded every batch.
  const Slots base = sh.base;
  const Kernel k = kernel;
  if (sh.align_slot >= 0) {
    for (; i + kLanes <= end; i += kLanes) k.template apply<true>(base, i);
    fence_streaming_stores();
  } else {
    for (; i + kLanes <= end; i += kLanes) k.template apply<false>(base, i);
  }
  if (i < end) apply_padded(sh, i, end - i, kernel);
}

// Shards below this many elements run on the calling thread: a TBB fork costs more.
inline constexpr std::size_t kParallelMinElems = std::size_t{1} << 16;

template <class Kernel>
void run_elementwise(const Shard& sh, std::size_t n, std::size_t block_elems, const Kernel& kernel) {
  if (n == 0) return;
  const std::size_t blocks = (n + block_elems - 1) / block_elems;
  if (blocks == 1 || n < kParallelMinElems) {
    run_range(sh, 0, n, kernel);
    return;
  }
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, blocks, 1), [&](const tbb::blocked_range<std::size_t>& r) {
    for (std::size_t b = r.begin(); b != r.end(); ++b) {
      run_range(sh, b * block_elems, std::min(n, (b + 1) * block_elems), kernel);
    }
  });
}

}  // namespace strata::optim::detail
