// Gradient buffers and their reduction. Every stage takes the same path per micro-batch:
// widen the layer's gradient buffer to fp32 bucket by bucket, sum it over ranks (all-reduce
// for stages 0-1, reduce-scatter for 2-3: with Gloo both are the same all-reduce of the same
// length, so the sums are bitwise equal) and add it to the fp32 accumulator. The buffer is
// freed once reduced. With overlap_comm the reduction runs on a reduce stream while the
// trainer goes on with the next layer's backward; step() waits for it. Gradients whose
// accumulator lives in host RAM (optimizer offloaded) cross the link first. An accumulator
// on the device is updated there by device ops: directly on one rank; with the device
// communicator (EngineOptions::device_comm) after a reduce-scatter in device memory (and an
// all-gather at stages 0-1). These are the paths a GPU takes; they give the same bits.
#include <cstring>
#include <functional>

#include "engine/detail/engine_impl.h"
#include "runtime/core/error.h"
#include "runtime/device/ops.h"

namespace strata::engine {

std::vector<TensorView> Engine::Impl::grad_buffers(int li) {
  auto& S = layers[li];
  const auto& L = layout->layers()[li];
  STRATA_CHECK(in_step, Errc::invalid_argument, "grad_buffers(", L.id, ") outside begin_step()/step()");
  if (S.grad_buf == nullptr) {
    // When the device is full, prefetched or retained layers give way (furthest next use
    // first), then the buffers of reductions still running on the reduce stream are waited
    // for (each is freed when its reduction completes).
    bool waited = false;
    for (;;) {
      try {
        S.grad_buf = ledger->allocate(Tier::device, Kind::buffers, L.padded * cbytes,
                                      str_cat("layer ", L.id, " gradient buffer"));
        break;
      } catch (const Error& e) {
        if (e.code() != Errc::out_of_budget) throw;
        if (drop_retained()) continue;
        if (reduce_stream == nullptr || waited) throw;
        Tracer::Span span(options.tracer, "compute", str_cat("wait reductions L", L.id));
        reduce_stream->synchronize();
        waited = true;
      }
    }
    dev_stream->memset_async(S.grad_buf, 0, L.padded * cbytes);
    dev_stream->synchronize();
  }
  return views(li, S.grad_buf, cdt);
}

void Engine::Impl::reduce_grads(int li) {
  auto& S = layers[li];
  const auto& L = layout->layers()[li];
  STRATA_CHECK(S.grad_buf != nullptr, Errc::invalid_argument, "reduce_grads(", L.id, ") without grad_buffers(", L.id,
               ") in this micro-batch");
  void* grads = S.grad_buf;
  S.grad_buf = nullptr;
  ++S.reductions;
  const auto t0 = Tracer::Clock::now();
  // One sequence for both modes: per bucket widen -> collective -> accumulate, then free.
  // Inline, each step runs now. With overlap_comm each step is a task on the reduce
  // stream, and every collective is still issued now, in call order (stream-ordered form:
  // queued at once, started when the stream gets there), so the sequence of collectives is
  // the same on every rank whatever the timing; the stream's FIFO order is what lets all
  // buckets share one scratch buffer.
  device::Stream* st = reduce_stream.get();
  // A collective on host memory (Gloo) cannot wait inside a CUDA host function (the driver
  // may run them one at a time, so a gated op could wait on another stream's callback):
  // on a CUDA device, reductions into host accumulators at world > 1 run inline.
  if (acc_on_host(li) && world > 1 && dev.backend() == device::Backend::cuda) st = nullptr;
  auto run = [st](std::function<void()> f) {
    if (st != nullptr)
      st->launch_host(std::move(f));
    else
      f();
  };
  const bool stage01 = cfg.zero.stage <= 1;
  // With the optimizer state off the device, the accumulator lives in host RAM: each bucket
  // leaves the device (D2H into the pinned gradient staging) before it is widened. Without a
  // reduce stream the copy runs on the transfer stream and is waited for at once.
  const bool to_host = acc_on_host(li);
  // The accumulator on the device and one rank: nothing crosses the link and there is no
  // collective, so each bucket is widened and added in device memory by one device op (the
  // same bits as widening into the scratch and adding). Several ranks with device
  // collectives: widened into the device scratch, reduce-scattered (then all-gathered back
  // at stages 0-1: the same sums as an all-reduce at every stage, whatever the backend's
  // algorithms) and added, all in device memory.
  if (!to_host && (world == 1 || device_collectives())) {
    device::Stream& ds = st != nullptr ? *st : *dev_stream;
    for (std::size_t k = 0; k < L.buckets.size(); ++k) {
      const auto& b = layout->buckets()[L.buckets[k]];
      const std::size_t pos = bucket_pos(b, L);
      float* acc = stage01 ? S.acc + pos : S.acc + S.shard_off[k];
      const char* src = static_cast<const char*>(grads) + pos * cbytes;
      if (world == 1) {
        device::accumulate_async(ds, acc, src, cdt, b.padded);
        continue;
      }
      device::convert_async(ds, src, cdt, dscratch, DType::fp32, b.padded);
      dcomm->reduce_scatter(dscratch, dscratch_shard, b.shard, DType::fp32, comm::ReduceOp::sum, ds);
      if (stage01) dcomm->all_gather(dscratch_shard, dscratch, b.shard, DType::fp32, ds);
      device::accumulate_async(ds, acc, stage01 ? dscratch : dscratch_shard, DType::fp32, stage01 ? b.padded : b.shard);
    }
    ds.launch_host([this, grads, id = L.id, t0] {
      ledger->retire(grads);
      if (options.tracer != nullptr)
        options.tracer->record("reduce", str_cat("reduce L", id), t0, Tracer::Clock::now());
    });
    if (st == nullptr) dev_stream->synchronize();
    return;
  }
  for (std::size_t k = 0; k < L.buckets.size(); ++k) {
    const auto& b = layout->buckets()[L.buckets[k]];
    const std::size_t pos = bucket_pos(b, L);
    const char* src = static_cast<const char*>(grads) + pos * cbytes;
    if (to_host) {
      const std::size_t bytes = b.padded * cbytes;
      io.d2h_bytes += bytes;
      if (st != nullptr) {
        st->copy_async(grad_stage, src, bytes, device::CopyKind::device_to_host);
      } else {
        Tracer::Span span(options.tracer, "copy", str_cat("D2H grads L", L.id));
        xfer_stream->copy_async(grad_stage, src, bytes, device::CopyKind::device_to_host);
        xfer_stream->synchronize();
      }
      src = static_cast<const char*>(grad_stage);
    }
    run([this, src, n = b.padded] { convert(src, cdt, scratch, DType::fp32, n); });
    if (world > 1) {
      if (st != nullptr) {
        if (stage01)
          comm->all_reduce(scratch, b.padded, DType::fp32, comm::ReduceOp::sum, *st);
        else
          comm->reduce_scatter(scratch, scratch_shard, b.shard, DType::fp32, comm::ReduceOp::sum, *st);
      } else {
        if (stage01)
          comm->all_reduce(scratch, b.padded, DType::fp32, comm::ReduceOp::sum);
        else
          comm->reduce_scatter(scratch, scratch_shard, b.shard, DType::fp32, comm::ReduceOp::sum);
      }
    }
    const float* reduced = (stage01 || world == 1) ? scratch : scratch_shard;
    float* acc = stage01 ? S.acc + pos : S.acc + S.shard_off[k];
    const std::size_t n = stage01 ? b.padded : b.shard;
    run([reduced, acc, n] {
      for (std::size_t i = 0; i < n; ++i) acc[i] += reduced[i];
    });
  }
  run([this, grads, id = L.id, t0] {
    ledger->retire(grads);
    if (options.tracer != nullptr) options.tracer->record("reduce", str_cat("reduce L", id), t0, Tracer::Clock::now());
  });
}

}  // namespace strata::engine
