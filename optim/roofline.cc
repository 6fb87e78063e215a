// The streaming roofline kernel (see roofline.h). Its loads and stores are the same
// instructions the optimizer kernels use (simd_io.h) on the same shard layout (dispatch.h);
// only the arithmetic between them is replaced by an OR with a run-time zero, which the
// compiler cannot fold away and which leaves every bit as it was.
#include "optim/roofline.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "optim/detail/dispatch.h"
#include "runtime/core/q8_codec.h"

namespace strata::optim {
namespace {

using detail::UB;

template <DType T> UB load_bits(const void* base, std::size_t i) noexcept {
  if constexpr (T == DType::fp32)
    return UB::load_unaligned(static_cast<const std::uint32_t*>(base) + i);
  else
    return detail::load_u16(static_cast<const std::uint16_t*>(base) + i);
}

template <DType T> void store_bits(void* base, std::size_t i, const UB& x) noexcept {
  if constexpr (T == DType::fp32)
    x.store_unaligned(static_cast<std::uint32_t*>(base) + i);
  else
    detail::store_u16<false>(static_cast<std::uint16_t*>(base) + i, x);
}

template <DType G, DType S, class Copy, bool kM, bool kV> struct StreamKernel {
  UB zero;  // 0 at run time; opaque to the compiler

  // All loads before any store, as in the optimizer kernels: the buffers share their offsets
  // modulo 4 KiB, and a load issued behind a store to the same 4 KiB offset waits on it
  // (4K aliasing), which would make this ceiling artificially low.
  template <bool kNonTemporal> void apply(const detail::Slots& s, std::size_t i) const noexcept {
    const UB touch = load_bits<G>(s.ptr[detail::kGrad], i) & zero;
    const UB p = load_bits<DType::fp32>(s.ptr[detail::kMaster], i) | touch;
    UB m(0u), v(0u);
    if constexpr (kM) m = load_bits<S>(s.ptr[detail::kM], i) | touch;
    if constexpr (kV) v = load_bits<S>(s.ptr[detail::kV], i) | touch;
    store_bits<DType::fp32>(s.ptr[detail::kMaster], i, p);
    if constexpr (kM) store_bits<S>(s.ptr[detail::kM], i, m);
    if constexpr (kV) store_bits<S>(s.ptr[detail::kV], i, v);
    if constexpr (Copy::has) {
      detail::store_u16<kNonTemporal>(static_cast<std::uint16_t*>(s.ptr[detail::kCopy]) + i, p >> 16);
    }
  }
};

std::atomic<std::uint32_t> g_zero{0};

// q8 moments: the q8 step's driver (detail/q8_step.h) over 16-element blocks, each block's
// master, grad and copy lanes streamed as above and its two 17-byte moment blocks read and
// written whole.
void q8_pass(const StepArgs& a, const detail::Shard& sh, StateUse use, const StepOptions& o, const UB& zero) {
  const std::uint8_t z = static_cast<std::uint8_t>(g_zero.load(std::memory_order_relaxed));
  auto touch = [z](void* base, std::size_t b) {
    std::uint8_t block[q8::kBlockBytes];
    auto* p = static_cast<std::uint8_t*>(base) + b * q8::kBlockBytes;
    std::memcpy(block, p, sizeof block);
    for (auto& c : block) c |= z;
    std::memcpy(p, block, sizeof block);
  };
  detail::with_grad_dtype(a.grad_dtype, [&](auto g) {
    detail::with_copy(a, [&](auto copy) {
      const StreamKernel<decltype(g)::value, DType::fp32, decltype(copy), false, false> k{zero};
      auto range = [&](std::size_t b, std::size_t e) {
        for (; b < e; ++b) {
          detail::Slots s;
          for (int slot : {detail::kMaster, detail::kGrad, detail::kCopy})
            if (sh.base.ptr[slot])
              s.ptr[slot] = static_cast<unsigned char*>(sh.base.ptr[slot]) + b * q8::kBlockElems * sh.elem_bytes[slot];
          for (std::size_t j = 0; j < q8::kBlockElems; j += detail::kLanes) k.template apply<false>(s, j);
          if (use.m) touch(a.m, b);
          if (use.v) touch(a.v, b);
        }
      };
      const std::size_t blocks = a.n / q8::kBlockElems, per_task = std::max<std::size_t>(1, o.block_elems / 16);
      tbb::parallel_for(tbb::blocked_range<std::size_t>(0, blocks, per_task),
                        [&](const tbb::blocked_range<std::size_t>& r) { range(r.begin(), r.end()); });
    });
  });
}

}  // namespace

StateUse state_use(UpdateRule rule) noexcept {
  switch (rule) {
    case UpdateRule::lion:
      return {true, false};
    case UpdateRule::adagrad:
      return {false, true};
    default:
      return {true, true, true};
  }
}

void roofline_pass(UpdateRule rule, const StepArgs& args, const StepOptions& options) {
  const StateUse use = state_use(rule);
  validate_step_args(args, use, "roofline pass");
  validate_step_options(options, "roofline pass");
  if (args.n == 0) return;
  const detail::Shard shard = detail::make_shard(args, use);
  const UB zero(g_zero.load(std::memory_order_relaxed));
  if (args.state_format == MomentFormat::q8) {
    q8_pass(args, shard, use, options, zero);
    return;
  }
  detail::with_grad_dtype(args.grad_dtype, [&](auto g) {
    detail::with_state_dtype(args.state_format, [&](auto st) {
      detail::with_copy(args, [&](auto copy) {
        constexpr DType G = decltype(g)::value, S = decltype(st)::value;
        using Copy = decltype(copy);
        auto run = [&](auto kernel) { detail::run_elementwise(shard, args.n, options.block_elems, kernel); };
        if (use.m && use.v)
          run(StreamKernel<G, S, Copy, true, true>{zero});
        else if (use.m)
          run(StreamKernel<G, S, Copy, true, false>{zero});
        else
          run(StreamKernel<G, S, Copy, false, true>{zero});
      });
    });
  });
}

}  // namespace strata::optim
