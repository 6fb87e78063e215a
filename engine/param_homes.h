// ParamHomes: where each layer's compute-dtype parameters live (docs/design.md, "The
// engine's parts"). It owns the resident copy on the device (stages 0-2, and stage-3 layers
// below stage3_param_persistence_threshold) and, at stage 3, this rank's shards on the
// device or in host RAM (on NVMe they are in the NVMe tier's parameter store). Which tier each
// layer's shards live on, and which layers are persistent, it reads from the shard map.
//
// Protocol. setup() calls add_layer(li) in layer order once placement has filled the shard
// map, then write(li, full, shard) with the first values (fp32, converted to the
// compute dtype where they live). After the optimizer, refresh() rebuilds what is replicated
// from the new shards: each bucket's replica at stages 1-2 (all-gathered from its owners) and
// the resident copy of persistent stage-3 layers. migrate(to) moves stage-3 shards to new
// tiers between a step's gathers and its optimizer (nothing gathered, no write-back in
// flight): when the set of NVMe layers changes, a new parameter store holding every layer
// that is or will be on NVMe is filled first (a failure drops it and throws, nothing moved)
// and adopted, so a layer leaving NVMe can always fall back to it; then each layer going to
// the device or host gets its new home on its own, and one that does not fit stays where it
// was (returned). Every other layer is on its tier in `to` when migrate() returns; the
// placement records that in the shard map (migrate() reads the tiers they came from there).
#pragma once

#include <vector>

#include "engine/device_swap.h"
#include "engine/engine.h"
#include "engine/layout.h"
#include "engine/nvme_homes.h"
#include "engine/shard_map.h"
#include "offload/ledger.h"
#include "runtime/comm/communicator.h"
#include "runtime/device/device.h"

namespace strata::engine {

class ParamHomes {
 public:
  struct Context {  // what the homes use and do not own
    const Layout& layout;
    int stage = 0;
    int rank = 0, world = 1;
    DType cdt = DType::fp32;
    device::Stream& dev_stream;  // copies to and from device memory, device collectives
    MemoryLedger& ledger;
    NvmeHomes& nvme;
    const ShardMap& shards;  // where each layer's shards live, which layers are persistent
    comm::Communicator* comm = nullptr;
    comm::Communicator* dcomm = nullptr;  // device-memory collectives, or null
    IoStats& io;
  };

  explicit ParamHomes(const Context& ctx)
      : c_(ctx), cbytes_(dtype_size(ctx.cdt)), layers_(ctx.layout.layers().size()) {}
  ~ParamHomes();
  ParamHomes(const ParamHomes&) = delete;
  ParamHomes& operator=(const ParamHomes&) = delete;

  void add_layer(int li);
  void write(int li, const float* full, const float* shard);
  // Shards written to the NVMe parameter store go to its other generation until
  // commit_writes() makes them current; discard_writes() drops them (a failed load).
  void commit_writes();
  void discard_writes() noexcept;
  // This rank's own part of layer li's compute copies (the
  // optimizer's elements), widened to fp32 into `out`, wherever they live (stage-3 shards on
  // NVMe read through the parameter store). What a frozen layer has in place of masters.
  void read_own(int li, float* out);
  void refresh();
  std::vector<int> migrate(const std::vector<Tier>& to);
  // Every device allocation (resident copies, stage-3 shards on the device), each replaced by
  // what fn returns (device_swap.h).
  void device_memory(const DeviceSwap::Fn& fn);

  void* full(int li) const { return layers_[li].full; }
  void* shard(int li) const { return layers_[li].shard; }

 private:
  struct Home {
    void* full = nullptr;   // resident copy, padded
    void* shard = nullptr;  // stage 3: this rank's shards (null on NVMe)
  };
  Tier tier(int li) const { return c_.shards.param_tier(li); }
  bool device_collectives() const noexcept { return c_.dcomm != nullptr && c_.world > 1; }
  std::size_t own_begin(const Bucket& b) const { return static_cast<std::size_t>(c_.rank) * b.shard; }
  void regather(int li, std::size_t k);
  void refill_store(const std::vector<Tier>& in_store);

  Context c_;
  std::size_t cbytes_;
  std::vector<Home> layers_;
};

}  // namespace strata::engine
