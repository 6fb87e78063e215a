// The streaming roofline kernel (see roofline.h). Its loads and stores are the same
// instructions the optimizer kernels use (simd_io.h) on the same shard layout (dispatch.h);
// only the arithmetic between them is replaced by an OR with a run-time zero, which the
// compiler cannot fold away and which leaves every bit as it was.
#include "optim/roofline.h"

#include <atomic>

#include "optim/detail/dispatch.h"

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

}  // namespace

StateUse state_use(UpdateRule rule) noexcept {
  switch (rule) {
    case UpdateRule::lion:
      return {true, false};
    case UpdateRule::adagrad:
      return {false, true};
    default:
      return {true, true};
  }
}

void roofline_pass(UpdateRule rule, const StepArgs& args, const StepOptions& options) {
  const StateUse use = state_use(rule);
  validate_step_args(args, use, "roofline pass");
  validate_step_options(options, "roofline pass");
  if (args.n == 0) return;
  const detail::Shard shard = detail::make_shard(args, use);
  const UB zero(g_zero.load(std::memory_order_relaxed));
  detail::with_grad_dtype(args.grad_dtype, [&](auto g) {
    detail::with_state_dtype(args.state_dtype, [&](auto st) {
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
