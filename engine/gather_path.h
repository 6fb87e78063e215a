// GatherPath: the engine's stage-3 gathers (docs/design.md, "The engine's parts"). It owns
// the gathered device buffers of the layers that are not persistent, their pinned staging,
// the events and flags of gathers in flight, the in-use and retained marks of every layer,
// the live window's count, the gather stream and the recorded gather order (GatherTrace).
//
// Protocol. A gather moves this rank's shards of a layer into pinned staging (a D2H copy of
// device shards, a host copy of host shards, or a read of the NVMe parameter store by the
// store's own queue, which the gather stream waits for), all-gathers them across ranks
// there (Gloo, stream-ordered) and copies the whole layer staging -> device: both link
// directions, so a throttled host link models PCIe. With device collectives only this
// rank's shards cross the link and the all-gather runs in device memory. The order of
// gathers in the first step is recorded, checked identical on every rank at end_step(), and
// replayed in later steps to prefetch ahead within stage3_prefetch_bucket_size and
// stage3_max_live_parameters; a released layer whose next use is within
// stage3_max_reuse_distance elements stays gathered (retained) until room is needed
// (drop_retained: the furthest next use goes first; a prefetch drops only those due after
// the layer it reads). A step whose gathers leave the recorded order turns prefetch off,
// warns, and is recorded anew. Evaluation gathers (eval = true)
// leave the trace alone. gather() of a persistent layer counts it in use and returns null:
// its parameters are the engine's resident copy. end_step() evicts every gathered layer
// (the optimizer makes them stale) and says whether a new trace was adopted.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "engine/engine.h"
#include "engine/gather_trace.h"
#include "engine/layout.h"
#include "engine/nvme_homes.h"
#include "engine/shard_map.h"
#include "offload/ledger.h"
#include "runtime/comm/communicator.h"
#include "runtime/core/trace.h"
#include "runtime/device/device.h"

namespace strata::engine {

class GatherPath {
 public:
  struct Context {  // what the gather path uses and does not own
    const Layout& layout;
    const ZeroConfig& zero;
    int rank = 0, world = 1;
    DType cdt = DType::fp32;
    device::Device& dev;
    MemoryLedger& ledger;
    comm::Communicator* comm = nullptr;
    comm::Communicator* dcomm = nullptr;  // device-memory collectives, or null
    Tracer* tracer = nullptr;
    IoStats& io;             // this step's link and NVMe traffic, wait time
    NvmeHomes& nvme;         // the parameter store and its queued requests
    const ShardMap& shards;  // each layer's tier and persistence (read at each gather)
    // This rank's shards of a layer in device or host memory (the shards of every bucket,
    // concatenated), asked at each gather (placement may move them); null on NVMe.
    std::function<const void*(int li)> shard_data;
    std::function<std::uint64_t()> reserve;  // device bytes a prefetch must leave free
    // Called before a prefetch reads the layer's shards; may block until they are current (the
    // optimizer's tail). Blocking, not skipping, keeps prefetch choices, and with them the
    // all-gathers, the same on every rank however the tails are timed. Null: nothing to wait for.
    std::function<void(int li)> before_read;
  };

  explicit GatherPath(const Context& ctx);
  ~GatherPath();  // waits for gathers in flight, frees what it holds
  GatherPath(const GatherPath&) = delete;
  GatherPath& operator=(const GatherPath&) = delete;

  void begin_step() { trace_.begin_step(); }
  // The gathered buffer (padded layer, compute dtype), or null for a persistent layer.
  // step: the step being run, for messages.
  void* gather(int li, bool eval, std::int64_t step);
  void release(int li, bool eval);
  bool drop_retained();
  // Collective when a trace is recorded (the ranks compare it). True when it adopted one.
  bool end_step(std::int64_t step);
  void evict_all();  // every gathered (not persistent) layer
  // An abandoned step or evaluation (Engine::abandon_step): every layer counts as released
  // and every gathered layer is evicted; the step's partial gather order is never adopted.
  void abandon();

  int in_use(int li) const { return layers_[li].in_use; }
  bool gathered(int li) const { return layers_[li].full != nullptr; }  // in use, retained or prefetched
  const GatherTrace& trace() const noexcept { return trace_; }
  std::uint64_t live_elems() const noexcept { return live_elems_; }
  std::uint64_t peak_live_elems() const noexcept { return peak_live_elems_; }
  void synchronize() { stream_->synchronize(); }  // every gather issued so far has landed

 private:
  struct LayerGather {
    void* full = nullptr;                   // gathered buffer (not persistent), or null
    int in_use = 0;                         // gather() calls not yet released
    bool retained = false;                  // released but kept for a near reuse
    std::shared_ptr<device::Event> ready;   // gather complete (recorded on the stream)
    void* staging = nullptr;                // pinned staging while a gather is in flight
    std::shared_ptr<std::atomic<bool>> ok;  // set by the gather's last stream task
    NvmeHomes::ParamRequest read;           // NVMe shards: the read the gather waits for
  };
  // Where this rank's shards of a layer live now: device or host memory, or NVMe (data null).
  struct Shards {
    const void* data = nullptr;
    Tier tier = Tier::device;
  };
  bool persistent(int li) const { return c_.shards.persistent(li); }
  bool device_collectives() const noexcept { return c_.dcomm != nullptr && c_.world > 1; }
  std::size_t bucket_pos(const Bucket& b, const LayerLayout& L) const { return b.flat_offset - L.flat_offset; }
  std::size_t own_begin(const Bucket& b) const { return static_cast<std::size_t>(c_.rank) * b.shard; }
  void issue(int li);
  void submit(int li);
  void stage_in(int li, const Shards& from, char* staging);
  void wait(int li);
  void evict(int li);
  void prefetch_after(std::size_t position);
  bool drop_retained_after(std::size_t position);
  void* allocate_staging(std::size_t bytes, const std::string& what);

  Context c_;
  std::size_t cbytes_;
  std::vector<LayerGather> layers_;
  std::unique_ptr<device::Stream> stream_;
  GatherTrace trace_;
  std::uint64_t live_elems_ = 0, peak_live_elems_ = 0;
};

}  // namespace strata::engine
