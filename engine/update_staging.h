// UpdateStaging: how the optimizer's updated compute-dtype copies reach the tier the layer's
// parameters live on (docs/design.md, "The engine's parts"). It owns the host staging of
// updated shards, the device buffers of the device optimizer's copies of shards that live
// off the device, and the transfer stream that copies staging to the device.
//
// Protocol. For elements [e0, e0 + n) of bucket k of layer li, target() says where the
// optimizer writes their compute copies: straight into the parameters where it can reach
// them (device optimizer and device parameters; CPU optimizer and host shards), else into
// host staging (NVMe shards; device parameters updated by the CPU optimizer), else, for the
// device optimizer of a stage-3 layer whose shards live off the device, into a device buffer.
// After writing through staging the caller reports written(li, n); once the whole layer is
// in, the staging goes to the device (H2D, waited for) or to the parameter store (a write
// behind the optimizer on the store's queue, which frees the staging when done; a
// layer whose optimizer state is on NVMe too first waits for the write-back queued before it,
// so that the staging held stays within the estimate's two layers however slow the NVMe).
// flush_device(li) after a layer's device updates moves the device buffer to the shards
// (through staging to NVMe). drop() frees what a failed step left. The step commits the
// shards written to the parameter store, or aborts them, through commit_params() and
// abort_params().
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "engine/engine.h"
#include "engine/layout.h"
#include "engine/nvme_homes.h"
#include "engine/shard_map.h"
#include "offload/ledger.h"
#include "runtime/core/trace.h"
#include "runtime/device/device.h"

namespace strata::engine {

class UpdateStaging {
 public:
  // A layer's parameters in memory (ParamHomes').
  struct Copies {
    void* full = nullptr;   // resident copy (stages 0-2, persistent stage-3 layers)
    void* shard = nullptr;  // stage 3: this rank's shards on the device or the host; null on NVMe
  };
  struct Context {  // what the staging uses and does not own
    const Layout& layout;
    int stage = 0;
    int rank = 0;
    DType cdt = DType::fp32;
    device::Device& dev;
    device::Stream& dev_stream;  // the device optimizer's stream
    MemoryLedger& ledger;
    NvmeHomes& nvme;
    IoStats& io;
    Tracer* tracer = nullptr;
    const ShardMap& shards;                // where each layer's parameters live, which side runs its optimizer
    std::function<Copies(int li)> copies;  // asked each time (placement may move the shards)
  };
  struct Target {
    char* copy = nullptr;  // where the compute copy of element e0 goes
    bool staged = false;   // through host staging: report written(li, n) after
  };

  explicit UpdateStaging(const Context& ctx);
  ~UpdateStaging();
  UpdateStaging(const UpdateStaging&) = delete;
  UpdateStaging& operator=(const UpdateStaging&) = delete;

  Target target(int li, std::size_t k, std::size_t e0);
  void* resident_copy(int li) const { return c_.copies(li).full; }  // a replicated layer's compute copy
  void written(int li, std::uint64_t elems);
  void flush_device(int li);
  void drop() noexcept;
  // Elements [first, first + count) of this rank's own part of layer li's compute copies
  // rewritten from their fp32 masters (the optimizer's elements: the whole padded layer at stage
  // 0, this rank's shard above) where they live on the device or in host RAM, through a bounded
  // buffer and the device optimizer's stream, waited for; stage-3 shards on NVMe are left to the
  // parameter store (abort_params() drops what was written). The overlapped step's undo.
  void restore_copies(int li, std::size_t first, std::size_t count, const float* master);
  // The NVMe parameter store's side of a step: commit_params() queues the commit of every
  // shard written so far behind those writes on the store's queue, commit_params(li) layer li's
  // alone (nothing where its parameters are not on NVMe), abort_params() drops what was
  // written and not committed (the last committed shards stay current; the caller has let
  // queued writes finish). Nothing without a parameter store.
  void commit_params();
  void commit_params(int li);
  void abort_params() noexcept;
  // After abort_params(): layer li's NVMe shard files mix two states (the store had committed
  // part of its write early, its spare files in use); rewrite_params() writes the whole shard
  // (compute dtype, as laid out) and commits it.
  bool params_stale(int li) const { return home(li).param_tier == Tier::nvme && c_.nvme.params_stale(li); }
  void rewrite_params(int li, const void* shard) { c_.nvme.rewrite_params(li, shard); }
  void synchronize();  // the transfer stream, if there is one
  // Counts traffic into `io` instead of the context's (null: the context's again): the
  // overlapped step's lane counts its own while the trainer's thread counts the step's.
  void count_into(IoStats* io) noexcept { io_ = io; }

 private:
  struct LayerStaging {
    void* stage = nullptr;        // host: the layer's updated copies (copy_elems of them)
    std::uint64_t done = 0;       // elements of `stage` written this step
    void* device_copy = nullptr;  // device: the device optimizer's copies of off-device shards
  };
  std::size_t own_begin(const Bucket& b) const { return static_cast<std::size_t>(c_.rank) * b.shard; }
  // Where a layer's parameters live and which side runs its optimizer.
  struct Home {
    void* full = nullptr;
    void* shard = nullptr;
    Tier param_tier = Tier::device;
    Tier opt_tier = Tier::device;
  };
  Home home(int li) const {
    const Copies c = c_.copies(li);
    return {c.full, c.shard, c_.shards.param_tier(li), c_.shards.opt_tier(li)};
  }
  std::size_t copy_elems(int li) const;
  void* staging(int li);  // the layer's host staging when its copies pass through it, else null

  IoStats& io() noexcept { return io_ != nullptr ? *io_ : c_.io; }

  Context c_;
  IoStats* io_ = nullptr;
  std::size_t cbytes_;
  std::vector<LayerStaging> layers_;
  std::unique_ptr<device::Stream> xfer_;  // H2D of staged copies (device parameters, CPU optimizer)
  NvmeHomes::ParamRequest last_write_;    // the last parameter write-back queued (ticket 0: none yet)
};

}  // namespace strata::engine
