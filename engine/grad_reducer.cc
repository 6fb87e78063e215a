// The gradient path (the protocol in grad_reducer.h).
#include "engine/grad_reducer.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "engine/tier_copy.h"
#include "optim/device_step.h"

#include "runtime/core/error.h"
#include "runtime/core/log.h"
#include "runtime/device/ops.h"

namespace strata::engine {

namespace {

std::pair<std::uint64_t, std::uint64_t> largest_bucket_and_shard(const Layout& layout) {
  std::uint64_t max_bucket = 0, max_shard = 0;
  for (const auto& b : layout.buckets()) {
    max_bucket = std::max<std::uint64_t>(max_bucket, b.padded);
    max_shard = std::max<std::uint64_t>(max_shard, b.shard);
  }
  return {max_bucket, max_shard};
}

}  // namespace

std::uint64_t GradReducer::device_scratch_bytes(const Layout& layout, bool device_collectives) {
  if (!device_collectives) return 0;
  const auto [max_bucket, max_shard] = largest_bucket_and_shard(layout);
  return (max_bucket + max_shard) * 4;
}

std::uint64_t GradReducer::host_scratch_bytes(const Layout& layout, std::size_t cbytes, bool any_acc_on_host) {
  const auto [max_bucket, max_shard] = largest_bucket_and_shard(layout);
  // One rank adds a copied-back gradient straight into its accumulator: no fp32 scratch.
  return (layout.world_size() > 1 ? (max_bucket + max_shard) * 4 : 0) + (any_acc_on_host ? max_bucket * cbytes : 0);
}

GradReducer::GradReducer(const Context& ctx)
    : c_(ctx), cbytes_(dtype_size(ctx.cdt)), layers_(ctx.layout.layers().size()) {
  const auto [max_bucket, max_shard] = largest_bucket_and_shard(c_.layout);
  auto& ledger = c_.ledger;
  try {
    if (c_.world > 1) {  // widened gradients for the host collectives (reduce_on_host)
      scratch_ = static_cast<float*>(ledger.allocate(Tier::host, Kind::buffers, max_bucket * 4, "reduction scratch"));
      scratch_shard_ =
          static_cast<float*>(ledger.allocate(Tier::host, Kind::buffers, max_shard * 4, "reduction shard"));
    }
    if (device_collectives()) {
      dscratch_ =
          static_cast<float*>(ledger.allocate(Tier::device, Kind::buffers, max_bucket * 4, "device reduction scratch"));
      dscratch_shard_ =
          static_cast<float*>(ledger.allocate(Tier::device, Kind::buffers, max_shard * 4, "device reduction shard"));
    }
    if (c_.shards.any_acc_on_host()) {
      stage_ = ledger.allocate(Tier::host, Kind::buffers, max_bucket * cbytes_, "gradient staging (device -> host)");
      copy_stream_ = c_.dev.create_stream();
    }
    if (c_.overlap_comm) reduce_stream_ = c_.dev.create_stream();
  } catch (...) {
    for (void* p : {static_cast<void*>(scratch_), static_cast<void*>(scratch_shard_), static_cast<void*>(dscratch_),
                    static_cast<void*>(dscratch_shard_), stage_})
      ledger.free(p);
    throw;
  }
}

GradReducer::~GradReducer() {
  // Queued reductions still read the buffers and write the accumulators freed below.
  for (auto* st : {reduce_stream_.get(), copy_stream_.get(), &c_.dev_stream}) {
    if (st == nullptr) continue;
    try {
      st->synchronize();
    } catch (const std::exception&) {
      // Reported by whoever synchronized first; the buffers go either way.
    }
  }
  auto& ledger = c_.ledger;
  for (auto& q : in_flight_) ledger.free(q.buf);
  for (auto& g : layers_) {
    ledger.free(g.acc);
    ledger.free(g.buf);
  }
  for (void* p : {static_cast<void*>(scratch_), static_cast<void*>(scratch_shard_), static_cast<void*>(dscratch_),
                  static_cast<void*>(dscratch_shard_), stage_})
    ledger.free(p);
}

void GradReducer::add_layer(int li) {
  auto& g = layers_[li];
  const Tier tier = acc_tier(li);
  g.dtype = tier == Tier::device ? DType::fp32 : host_acc_dtype(c_.cdt, c_.world, c_.accumulation);
  const std::size_t bytes = acc_elems(li) * dtype_size(g.dtype);
  g.acc = c_.ledger.allocate(tier, Kind::grads, bytes, str_cat("layer ", c_.layout.layers()[li].id, " gradients"));
  fill_zero(c_.dev_stream, g.acc, bytes, tier);
}

void* GradReducer::buffer(int li, const std::function<bool()>& make_room) {
  auto& g = layers_[li];
  const auto& L = c_.layout.layers()[li];
  if (g.buf != nullptr) return g.buf;
  // When the device is full, make_room gives way first (prefetched or retained layers), then
  // the queued reductions are retired, oldest first (each frees its buffer).
  for (;;) {
    try {
      g.buf = c_.ledger.allocate(Tier::device, Kind::buffers, L.padded * cbytes_,
                                 str_cat("layer ", L.id, " gradient buffer"));
      break;
    } catch (const Error& e) {
      if (e.code() != Errc::out_of_budget) throw;
      if (make_room()) continue;
      if (in_flight_.empty()) throw;
      retire_oldest();
    }
  }
  c_.dev_stream.memset_async(g.buf, 0, L.padded * cbytes_);
  c_.dev_stream.synchronize();
  return g.buf;
}

void GradReducer::reduce(int li, IoStats& io) {
  auto& g = layers_[li];
  const auto& L = c_.layout.layers()[li];
  STRATA_CHECK(g.buf != nullptr, Errc::invalid_argument, "reduce_grads(", L.id, ") without grad_buffers(", L.id,
               ") in this micro-batch");
  void* grads = g.buf;
  g.buf = nullptr;
  ++g.reductions;
  const auto t0 = Tracer::Clock::now();
  // With overlap_comm each piece of work is a task on the reduce stream, and every
  // collective is still issued now, in call order (stream-ordered form: queued at once,
  // started when the stream gets there); the stream's FIFO order is what lets all buckets
  // share one scratch buffer. Inline otherwise.
  device::Stream* st = reduce_stream_.get();
  // A collective on host memory (Gloo) cannot wait inside a CUDA host function (the driver
  // may run them one at a time, so a gated op could wait on another stream's callback):
  // on a CUDA device, reductions into host accumulators at world > 1 run inline.
  const bool to_host = acc_on_host(li);
  if (to_host && c_.world > 1 && c_.dev.backend() == device::Backend::cuda) st = nullptr;
  if (st != nullptr) wait_for_room();
  // The accumulator on the device and one rank, or several ranks with device collectives:
  // nothing crosses the link and everything happens in device memory.
  if (!to_host && (c_.world == 1 || device_collectives()))
    reduce_on_device(li, grads, st, t0);
  else
    reduce_on_host(li, grads, st, io, t0);
  if (st != nullptr) {
    mark_queued(grads);  // freed when retired, at a point of the program's own order
  } else {
    c_.ledger.free(grads);  // the inline reduction has read it
  }
}

void GradReducer::wait_for_room() {
  while (in_flight_.size() >= max_in_flight(c_.world)) retire_oldest();
}

void GradReducer::retire_oldest() {
  {
    Tracer::Span span(c_.tracer, "compute", "wait reduction");
    in_flight_.front().done->synchronize();
  }
  c_.ledger.free(in_flight_.front().buf);
  spare_.push_back(std::move(in_flight_.front().done));
  in_flight_.pop_front();
}

void GradReducer::mark_queued(void* buf) {
  std::unique_ptr<device::Event> ev;
  if (spare_.empty()) {
    ev = c_.dev.create_event();
  } else {
    ev = std::move(spare_.back());
    spare_.pop_back();
  }
  reduce_stream_->record(*ev);
  in_flight_.push_back({std::move(ev), buf});
}

// One device op per bucket on one rank (the same bits as widening into the scratch and
// adding); with device collectives: widened into the device scratch, reduce-scattered (then
// all-gathered back at stages 0-1: the same sums as an all-reduce at every stage, whatever
// the backend's algorithms) and added.
void GradReducer::reduce_on_device(int li, const void* grads, device::Stream* st, Tracer::Clock::time_point t0) {
  const auto& L = c_.layout.layers()[li];
  auto& g = layers_[li];
  const bool stage01 = c_.stage <= 1;
  device::Stream& ds = st != nullptr ? *st : c_.dev_stream;
  for (std::size_t k = 0; k < L.buckets.size(); ++k) {
    const auto& b = c_.layout.buckets()[L.buckets[k]];
    const std::size_t pos = b.flat_offset - L.flat_offset;
    float* acc = static_cast<float*>(g.acc) + acc_offset(c_.layout, c_.stage, li, k);
    const char* src = static_cast<const char*>(grads) + pos * cbytes_;
    if (c_.world == 1) {
      device::accumulate_async(ds, acc, src, c_.cdt, b.padded);
      continue;
    }
    device::convert_async(ds, src, c_.cdt, dscratch_, DType::fp32, b.padded);
    c_.dcomm->reduce_scatter(dscratch_, dscratch_shard_, b.shard, DType::fp32, comm::ReduceOp::sum, ds);
    if (stage01) c_.dcomm->all_gather(dscratch_shard_, dscratch_, b.shard, DType::fp32, ds);
    device::accumulate_async(ds, acc, stage01 ? dscratch_ : dscratch_shard_, DType::fp32, stage01 ? b.padded : b.shard);
  }
  if (c_.tracer != nullptr) {
    ds.launch_host([tracer = c_.tracer, id = L.id, t0] {
      tracer->record("reduce", str_cat("reduce L", id), t0, Tracer::Clock::now());
    });
  }
  if (st == nullptr) c_.dev_stream.synchronize();
}

// Per bucket: (D2H into the pinned staging when the accumulator is in host RAM), then on one
// rank added straight into the accumulator; on several widened into the host scratch,
// all-reduced or reduce-scattered over ranks and added to the accumulator.
void GradReducer::reduce_on_host(int li, const void* grads, device::Stream* st, IoStats& io,
                                 Tracer::Clock::time_point t0) {
  const auto& L = c_.layout.layers()[li];
  auto& g = layers_[li];
  const bool stage01 = c_.stage <= 1;
  const bool to_host = acc_on_host(li);
  auto run = [st](std::function<void()> f) {
    if (st != nullptr)
      st->launch_host(std::move(f));
    else
      f();
  };
  // Traced on a stream: each bucket's copy and host work as the stream runs them ("reduce
  // work" lane; the "reduce" lane's spans start when a reduction is queued).
  Tracer* tracer = st != nullptr && c_.tracer != nullptr && c_.tracer->enabled() ? c_.tracer : nullptr;
  using Stamp = std::shared_ptr<Tracer::Clock::time_point>;
  const auto stamp = [&](const Stamp& at) { st->launch_host([at] { *at = Tracer::Clock::now(); }); };
  const auto work_span = [&](const Stamp& from, const char* what) {
    st->launch_host([tracer, from, name = str_cat(what, " L", L.id)] {
      tracer->record("reduce work", name, *from, Tracer::Clock::now());
    });
  };
  for (std::size_t k = 0; k < L.buckets.size(); ++k) {
    const auto& b = c_.layout.buckets()[L.buckets[k]];
    const std::size_t pos = b.flat_offset - L.flat_offset;
    const char* src = static_cast<const char*>(grads) + pos * cbytes_;
    const Stamp began = tracer != nullptr ? std::make_shared<Tracer::Clock::time_point>() : nullptr;
    if (tracer != nullptr) stamp(began);
    if (to_host) {
      const std::size_t bytes = b.padded * cbytes_;
      io.d2h_bytes += bytes;
      if (st != nullptr) {
        st->copy_async(stage_, src, bytes, device::CopyKind::device_to_host);
      } else {
        Tracer::Span span(c_.tracer, "copy", str_cat("D2H grads L", L.id));
        copy_stream_->copy_async(stage_, src, bytes, device::CopyKind::device_to_host);
        copy_stream_->synchronize();
      }
      src = static_cast<const char*>(stage_);
      if (tracer != nullptr) {
        work_span(began, "D2H");
        stamp(began);
      }
    }
    const std::size_t at = acc_offset(c_.layout, c_.stage, li, k);
    if (c_.world == 1) {
      // One rank: widened and added in one parallel pass (a narrow accumulator widened and
      // narrowed around the addition), the same bits as the scratch buffers' path below (a
      // copied-back gradient otherwise waits on one core).
      run([src, acc = static_cast<char*>(g.acc) + at * dtype_size(g.dtype), dt = g.dtype, cdt = c_.cdt, n = b.padded] {
        device::accumulate_host(acc, dt, src, cdt, n);
      });
      if (tracer != nullptr) work_span(began, "add");
      continue;
    }
    run([this, src, n = b.padded] { convert(src, c_.cdt, scratch_, DType::fp32, n); });
    {
      if (st != nullptr) {
        if (stage01)
          c_.comm->all_reduce(scratch_, b.padded, DType::fp32, comm::ReduceOp::sum, *st);
        else
          c_.comm->reduce_scatter(scratch_, scratch_shard_, b.shard, DType::fp32, comm::ReduceOp::sum, *st);
      } else {
        if (stage01)
          c_.comm->all_reduce(scratch_, b.padded, DType::fp32, comm::ReduceOp::sum);
        else
          c_.comm->reduce_scatter(scratch_, scratch_shard_, b.shard, DType::fp32, comm::ReduceOp::sum);
      }
    }
    // Several ranks: the accumulator is fp32 (host_acc_dtype).
    const float* reduced = stage01 ? scratch_ : scratch_shard_;
    run([reduced, acc = static_cast<float*>(g.acc) + at, n = stage01 ? b.padded : b.shard] {
      device::accumulate_host(acc, reduced, DType::fp32, n);
    });
    if (tracer != nullptr) work_span(began, "widen, reduce, add");
  }
  if (c_.tracer != nullptr) {
    run([tracer = c_.tracer, id = L.id, t0] {
      tracer->record("reduce", str_cat("reduce L", id), t0, Tracer::Clock::now());
    });
  }
}

void GradReducer::begin_step() {
  for (auto& g : layers_) g.reductions = 0;
}

void GradReducer::sync() {
  if (!reduce_stream_) return;
  reduce_stream_->synchronize();
  while (!in_flight_.empty()) retire_oldest();
}

std::unique_ptr<device::Event> GradReducer::completion() {
  if (!reduce_stream_) return nullptr;
  auto ev = c_.dev.create_event();
  reduce_stream_->record(*ev);
  return ev;
}

void GradReducer::drop_buffers() {
  for (auto& g : layers_) {
    c_.ledger.free(g.buf);
    g.buf = nullptr;
  }
}

void GradReducer::zero_layer(int li) {
  auto& g = layers_[static_cast<std::size_t>(li)];
  STRATA_CHECK(acc_on_host(li), Errc::internal, "zero_layer(", li, "): the accumulator is on the device");
  std::memset(g.acc, 0, acc_elems(li) * dtype_size(g.dtype));
}

void GradReducer::device_memory(const DeviceSwap::Fn& fn) {
  for (std::size_t li = 0; li < layers_.size(); ++li) {
    auto& g = layers_[li];
    if (acc_on_host(static_cast<int>(li)) || g.acc == nullptr) continue;
    g.acc = fn(g.acc, acc_elems(static_cast<int>(li)) * dtype_size(g.dtype), Kind::grads,
               str_cat("layer ", c_.layout.layers()[li].id, " gradients"));
  }
  const auto [max_bucket, max_shard] = largest_bucket_and_shard(c_.layout);
  dscratch_ = static_cast<float*>(fn(dscratch_, max_bucket * 4, Kind::buffers, "device reduction scratch"));
  dscratch_shard_ = static_cast<float*>(fn(dscratch_shard_, max_shard * 4, Kind::buffers, "device reduction shard"));
}

void GradReducer::zero(const std::vector<char>& skip) {
  for (std::size_t li = 0; li < layers_.size(); ++li) {
    auto& g = layers_[li];
    if ((li < skip.size() && skip[li] != 0) || g.acc == nullptr) continue;  // skipped, or a frozen layer's
    fill_zero(c_.dev_stream, g.acc, acc_elems(static_cast<int>(li)) * dtype_size(g.dtype),
              acc_tier(static_cast<int>(li)));
  }
  c_.dev_stream.synchronize();
}

optim::GradNorm GradReducer::shard_norm(int li, std::size_t k) const {
  const auto& L = c_.layout.layers()[static_cast<std::size_t>(li)];
  const DType dt = acc_dtype(li);
  const void* g = acc_at(li, update_offset(li, k, false));
  const std::size_t n = c_.layout.buckets()[L.buckets[k]].shard;
  return acc_on_host(li) ? optim::grad_norm_sq(g, dt, n) : optim::grad_norm_sq(c_.dev, c_.dev_stream, g, dt, n);
}

void GradReducer::add_shard_norm(int li, optim::GradNorm& into) const {
  const auto& L = c_.layout.layers()[static_cast<std::size_t>(li)];
  if (L.frozen) return;  // no gradient
  for (std::size_t k = 0; k < L.buckets.size(); ++k) into += shard_norm(li, k);
}

}  // namespace strata::engine
