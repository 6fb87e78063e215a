// GradReducer: the engine's gradient path (docs/design.md, "The engine's parts"). It owns
// the trainer's gradient buffers while they are handed out, the fp32 accumulators, the
// reduction scratch (host and, with device collectives, device), the pinned gradient
// staging and the streams reductions run on; no other part touches them.
//
// Protocol. setup() builds it once the layout and the placement are known, then calls
// add_layer(li) in layer order: layer li's accumulator, zeroed, on the device or in host RAM
// (where the shard map puts the layer's optimizer state). Per micro-batch the trainer gets
// buffer(li), a zeroed compute-dtype buffer on the device (make_room is called while the
// device is full; when it frees nothing, running reductions are waited for), and hands it
// back with reduce(li). Every ZeRO stage takes the same path: widen the buffer to fp32 bucket
// by bucket, sum it over ranks (all-reduce at stages 0-1, reduce-scatter at 2-3: with Gloo
// both are the same all-reduce of the same length, so the sums are bitwise equal) and add it
// to the accumulator, then free the buffer. With overlap_comm the reduction runs on the
// reduce stream while the trainer goes on; its collectives are still issued in call order,
// so every rank runs the same sequence. At most max_in_flight(world) reductions are queued
// there: reduce() waits for the oldest first, so the buffers they hold stay bounded (those
// plus the one the trainer fills) however much slower the collectives are than backward.
// A queued reduction's buffer is freed when the host retires it (that wait in reduce(), in
// buffer() when the device is full, or sync()), never from stream work: device use then
// changes only at the program's own points, so the gather path's choices that depend on it
// (prefetch, eviction) and with them the collectives are the same on every rank, however the
// streams are timed. Gradients whose accumulator lives in host RAM cross the link first; on
// one rank they are then added straight into it on TBB's workers, on several widened into a
// host scratch for the host collectives. An accumulator on the device is updated there by
// device ops: directly on one rank, and after a reduce-scatter in device memory (all-gathered
// back at stages 0-1) with the device communicator; these are the paths a GPU takes, with the
// same bits. begin_step() resets the per-layer reduction counts; before
// reading accumulator(li) the step calls sync(), after the optimizer zero().
// An accumulator in host RAM that takes exactly one gradient per step (one rank, one
// micro-batch, 16-bit compute: host_acc_dtype) holds it in the compute dtype: 0 + g is g
// (or +0 for -0), which that dtype represents, so storing it narrow and widening it on read
// gives the fp32 accumulator's bits at half its bytes. Readers take acc_dtype(li) with it.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "engine/device_swap.h"
#include "engine/engine.h"
#include "engine/layout.h"
#include "engine/shard_map.h"
#include "offload/ledger.h"
#include "optim/grad_norm.h"
#include "runtime/comm/communicator.h"
#include "runtime/core/trace.h"
#include "runtime/device/device.h"

namespace strata::engine {

class GradReducer {
 public:
  // Overlapped reductions queued at once: one rank's are local adds, far quicker than a
  // layer's backward, and two keep the stream busy; across ranks the collectives lag further
  // and four keep the link busy (against no bound, 2% of step time in a comm-bound world-2
  // run, for 10% less device memory there).
  static std::size_t max_in_flight(int world) noexcept { return world == 1 ? 2 : 4; }
  struct Context {  // what the reducer uses and does not own
    const Layout& layout;
    int stage = 0;
    bool overlap_comm = false;
    device::Device& dev;
    device::Stream& dev_stream;  // the engine's device stream: device ops without overlap
    comm::Communicator* comm = nullptr;
    comm::Communicator* dcomm = nullptr;  // device-memory collectives, or null
    int rank = 0, world = 1;
    DType cdt = DType::fp32;
    MemoryLedger& ledger;
    const ShardMap& shards;  // where each layer's accumulator lives: with its optimizer state
    Tracer* tracer = nullptr;
    std::int64_t accumulation = 1;  // micro-batches per step (gradient_accumulation_steps)
  };
  // When some accumulator will live in host RAM, the staging and a copy stream are made for it.
  explicit GradReducer(const Context& ctx);
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // The device scratch the reducer takes with device collectives (placement counts it first).
  static std::uint64_t device_scratch_bytes(const Layout& layout, bool device_collectives);
  // Host bytes the reducer holds from construction: the reduction scratch, and the gradient
  // staging when some accumulator lives in host RAM.
  static std::uint64_t host_scratch_bytes(const Layout& layout, std::size_t cbytes, bool any_acc_on_host);
  // Elements of layer li's fp32 accumulator: the whole padded layer at stages 0-1, this
  // rank's shard above.
  static std::size_t acc_elems(const Layout& layout, int stage, int li) {
    return stage <= 1 ? layout.layers()[li].padded : layout.layer_shard(li);
  }
  // Where bucket k of layer li starts in the accumulator: its place in the padded layer at
  // stages 0-1, this rank's shard of it above.
  static std::size_t acc_offset(const Layout& layout, int stage, int li, std::size_t k) {
    const auto& L = layout.layers()[li];
    return stage <= 1 ? layout.buckets()[L.buckets[k]].flat_offset - L.flat_offset : L.shard_offsets[k];
  }

  // The dtype of an accumulator in host RAM: the compute dtype when each step adds exactly one
  // gradient to it (world 1, accumulation 1, bf16 or fp16), else fp32. Device accumulators are
  // fp32. Placement and the estimate size host accumulators with it.
  static DType host_acc_dtype(DType cdt, int world, std::int64_t accumulation) noexcept {
    return world == 1 && accumulation <= 1 && dtype_size(cdt) == 2 ? cdt : DType::fp32;
  }

  void add_layer(int li);
  void* buffer(int li, const std::function<bool()>& make_room);
  void reduce(int li, IoStats& io);
  void begin_step();
  int reductions(int li) const { return layers_[li].reductions; }
  void sync();  // every reduction queued so far is in the accumulators
  // An event recorded after every reduction queued so far (another thread may wait on it),
  // or null when they all ran inline and are in.
  std::unique_ptr<device::Event> completion();
  bool overlapped() const noexcept { return reduce_stream_ != nullptr; }
  const void* accumulator(int li) const { return layers_[li].acc; }
  DType acc_dtype(int li) const { return layers_[li].dtype; }
  bool acc_on_host(int li) const { return c_.shards.acc_on_host(li); }
  // Layer li's accumulator from element `elem` on, in acc_dtype(li).
  const void* acc_at(int li, std::size_t elem) const {
    return static_cast<const char*>(layers_[li].acc) + elem * dtype_size(layers_[li].dtype);
  }
  // The element of layer li's accumulator where this rank's update of bucket k begins: its
  // shard of the bucket, or with whole_bucket (stage 0's update) the bucket's start. Stages
  // 2-3 accumulate only the shard, stages 0-1 the whole bucket.
  std::size_t update_offset(int li, std::size_t k, bool whole_bucket) const {
    const std::size_t at = acc_offset(c_.layout, c_.stage, li, k);
    if (c_.stage >= 2 || whole_bucket) return at;
    return at + static_cast<std::size_t>(c_.rank) * c_.layout.buckets()[c_.layout.layers()[li].buckets[k]].shard;
  }
  // This rank's share of the squared norm of layer li's accumulated gradient, over bucket k
  // (shard_norm), or added to `into` bucket by bucket (add_shard_norm; nothing for a frozen
  // layer), computed where the accumulator lives (on the engine's device stream there).
  optim::GradNorm shard_norm(int li, std::size_t k) const;
  void add_shard_norm(int li, optim::GradNorm& into) const;
  // Every accumulator, for the next step, but those whose skip[li] is set (skip may be empty).
  void zero(const std::vector<char>& skip = {});
  // An abandoned step: the gradient buffers handed out and not reduced are freed unread.
  void drop_buffers();
  void zero_layer(int li);  // one accumulator in host RAM (the overlapped step's tail, on its thread)
  // Between steps: the accumulators on the device and the device scratch, each replaced by
  // what fn returns (device_swap.h).
  void device_memory(const DeviceSwap::Fn& fn);

 private:
  struct LayerGrads {
    void* acc = nullptr;  // padded (stages 0-1) or this rank's shards (2-3), in `dtype`
    DType dtype = DType::fp32;
    void* buf = nullptr;  // the trainer's gradient buffer while handed out
    int reductions = 0;   // reduce() calls this step
  };
  bool device_collectives() const noexcept { return c_.dcomm != nullptr && c_.world > 1; }
  Tier acc_tier(int li) const { return acc_on_host(li) ? Tier::host : Tier::device; }
  std::size_t acc_elems(int li) const { return acc_elems(c_.layout, c_.stage, li); }
  void reduce_on_device(int li, const void* grads, device::Stream* st, Tracer::Clock::time_point t0);
  void reduce_on_host(int li, const void* grads, device::Stream* st, IoStats& io, Tracer::Clock::time_point t0);

  Context c_;
  std::size_t cbytes_;
  std::vector<LayerGrads> layers_;
  float* scratch_ = nullptr;        // fp32, largest bucket
  float* scratch_shard_ = nullptr;  // fp32, largest shard
  float* dscratch_ = nullptr;       // the same two on the device (device collectives)
  float* dscratch_shard_ = nullptr;
  void* stage_ = nullptr;                        // pinned, largest bucket in compute dtype (D2H)
  std::unique_ptr<device::Stream> copy_stream_;  // D2H without overlap (host accumulators)
  std::unique_ptr<device::Stream> reduce_stream_;
  // Each overlapped reduction, oldest first: the event recorded after it and the gradient
  // buffer it reads, freed when the host retires it. Events of retired ones are reused.
  struct InFlight {
    std::unique_ptr<device::Event> done;
    void* buf = nullptr;
  };
  std::deque<InFlight> in_flight_;
  std::vector<std::unique_ptr<device::Event>> spare_;
  void wait_for_room();  // until fewer than max_in_flight(world) reductions are queued
  void retire_oldest();  // waits for the oldest queued reduction and frees its buffer
  void mark_queued(void* buf);
};

}  // namespace strata::engine
