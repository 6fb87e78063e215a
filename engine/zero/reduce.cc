// Gradient buffers and their reduction. Every stage takes the same path per micro-batch:
// widen the layer's gradient buffer to fp32 bucket by bucket, sum it over ranks (all-reduce
// for stages 0-1, reduce-scatter for 2-3: with Gloo both are the same all-reduce of the same
// length, so the sums are bitwise equal) and add it to the fp32 accumulator. The buffer is
// freed at once, so stages 2-3 never hold more than one layer's 16-bit gradients.
#include <cstring>

#include "engine/core/error.h"
#include "engine/zero/detail/engine_impl.h"

namespace strata::zero {

std::vector<TensorView> Engine::Impl::grad_buffers(int li) {
  auto& S = layers[li];
  const auto& L = layout->layers()[li];
  STRATA_CHECK(in_step, Errc::invalid_argument, "grad_buffers(", L.id, ") outside begin_step()/step()");
  if (S.grad_buf == nullptr) {
    S.grad_buf = ledger->allocate(Tier::device, Kind::buffers, L.padded * cbytes, str_cat("layer ", L.id, " gradient buffer"));
    std::memset(S.grad_buf, 0, L.padded * cbytes);
  }
  return views(li, S.grad_buf, cdt);
}

void Engine::Impl::reduce_grads(int li) {
  auto& S = layers[li];
  const auto& L = layout->layers()[li];
  STRATA_CHECK(S.grad_buf != nullptr, Errc::invalid_argument, "reduce_grads(", L.id,
               ") without grad_buffers(", L.id, ") in this micro-batch");
  Tracer::Span span(options.tracer, "reduce", str_cat("reduce L", L.id));
  const int stage = cfg.zero.stage;
  for (std::size_t k = 0; k < L.buckets.size(); ++k) {
    const auto& b = layout->buckets()[L.buckets[k]];
    const std::size_t pos = bucket_pos(b, L);
    convert(static_cast<char*>(S.grad_buf) + pos * cbytes, cdt, scratch, DType::fp32, b.padded);
    const float* reduced;
    float* acc;
    std::size_t n;
    if (stage <= 1) {
      if (world > 1) comm->all_reduce(scratch, b.padded, DType::fp32, comm::ReduceOp::sum);
      reduced = scratch;
      acc = S.acc + pos;
      n = b.padded;
    } else {
      if (world > 1) {
        comm->reduce_scatter(scratch, scratch_shard, b.shard, DType::fp32, comm::ReduceOp::sum);
        reduced = scratch_shard;
      } else {
        reduced = scratch;
      }
      acc = S.acc + S.shard_off[k];
      n = b.shard;
    }
    for (std::size_t i = 0; i < n; ++i) acc[i] += reduced[i];
  }
  ledger->free(S.grad_buf);
  S.grad_buf = nullptr;
  ++S.reductions;
}

}  // namespace strata::zero
