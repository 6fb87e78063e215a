// OptimizerState: each layer's optimizer state (docs/design.md, "The engine's parts"): the
// fp32 master weights and exp_avg and exp_avg_sq in the moment format (fp32, bf16 or q8:
// runtime/core/moment_format.h), opt_elems(li) elements each (the padded layer at stage 0, this
// rank's shard of it above), wherever it lives: it owns the arrays of the layers whose state
// lives on the device or in host RAM, and the optimizer swapper (offload/optimizer_swapper.h)
// that holds the state of the layers on NVMe in checksummed swap files under
// offload_optimizer.nvme_path/rank<R> (the directory locked through the NVMe tier), with what it
// charges to the ledger: its buffers to the host tier, its files (committed and spare) to NVMe.
//
// Protocol. Each layer's tier is the shard map's (shard_map.h). setup() calls open_swapper()
// when some layers' state is on NVMe (host_reserve: host bytes its buffers leave for what setup
// allocates after it), then add_layer(li) in layer order;
// the arrays are allocated but hold nothing until write(). read(li, ...) and write(li, ...)
// move a layer's whole state to or from fp32 host arrays wherever it lives (a null pointer is
// skipped on read, zeros on write; bf16 moments are widened on read, exactly, and rounded to
// nearest even on write, q8 ones decoded and coded); both are synchronous. Writes of layers on NVMe go to the
// swapper's spare files: commit_writes(), after every layer was written, commits them,
// discard_writes() drops them (a failed load leaves NVMe state as it was, unless the swapper's
// spares ran out and it committed sub-groups as it wrote: then it refuses them until a load).
// The optimizer step updates resident layers in place through resident(li) and layers on NVMe through step_swapped(),
// which runs the swapper's step over their sub-groups (begin_swapped(): the overlapped lane pulls its own). The
// overlapped step updates a host layer out of place: spare(li) allocates (on first use, through the ledger, which
// refuses what the host budget cannot hold) a second set of arrays of the layer's tier that it writes the new state
// into, and swap_spare(li) makes them the layer's state (the old arrays become the spare) when the step is kept. Muon's
// layers in device memory or host RAM keep exp_avg_sq only for the elements outside hidden matrices (v_at(),
// v_elems()); read() and write() give and take it whole, zeros where none is kept.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "checkpoint/link_space.h"
#include "engine/config.h"
#include "engine/device_swap.h"
#include "engine/engine.h"
#include "engine/layout.h"
#include "engine/nvme_homes.h"
#include "engine/shard_map.h"
#include "offload/ledger.h"
#include "offload/optimizer_swapper.h"
#include "runtime/core/trace.h"
#include "runtime/device/device.h"

namespace strata::engine {

class OptimizerState {
 public:
  struct Context {            // what the state uses and does not own
    const EngineConfig& cfg;  // the stage, the moments' format (fp32, bf16 or q8), the swapper's options
    const Layout& layout;
    device::Stream& dev_stream;  // copies to and from device arrays
    MemoryLedger& ledger;
    NvmeHomes& nvme;         // the rank directory's lock
    const ShardMap& shards;  // each layer's optimizer tier
    Tracer* tracer = nullptr;
    int rank = 0;  // whose shard (the elements of Muon's matrices in it)
  };
  struct Arrays {  // a resident layer's state; null on NVMe
    float* master = nullptr;
    void* m = nullptr;  // moment_format()
    void* v = nullptr;
  };

  explicit OptimizerState(const Context& ctx) : c_(ctx), layers_(ctx.layout.layers().size()) {}
  // The swapper's options from the config (no directory: open_swapper() adds the rank's) with
  // `host_room` host bytes for its buffers (a missing nvme_path is refused, naming the key), and
  // its tensors: the layers `shards` puts on NVMe, in layer order. What placement and the
  // estimate (memory_estimate.h) size it with, too.
  static offload::SwapperOptions swapper_options(const EngineConfig& cfg, std::uint64_t host_room);
  static std::vector<offload::SwapTensor> swap_tensors(const Layout& layout, const ShardMap& shards);
  void open_swapper(std::uint64_t host_reserve = 0);
  ~OptimizerState();
  OptimizerState(const OptimizerState&) = delete;
  OptimizerState& operator=(const OptimizerState&) = delete;

  void add_layer(int li);
  Tier tier(int li) const { return c_.shards.opt_tier(li); }
  MomentFormat moment_format() const { return c_.cfg.optimizer.moment_format; }
  // Element `elem` of a moment array (q8: a multiple of 16, or it throws).
  void* moment_at(void* base, std::size_t elem) const {
    return static_cast<std::byte*>(base) + moment_offset(moment_format(), elem);
  }
  const void* moment_at(const void* base, std::size_t elem) const {
    return static_cast<const std::byte*>(base) + moment_offset(moment_format(), elem);
  }
  std::size_t elems(int li) const { return elems(c_.layout, c_.cfg.zero.stage, li); }
  static std::size_t elems(const Layout& layout, int stage, int li) {
    return stage == 0 ? layout.layers()[li].padded : layout.layer_shard(li);
  }
  // Where bucket k of layer li starts in the layer's arrays: its place in the padded layer at
  // stage 0, this rank's shard of it above.
  static std::size_t offset(const Layout& layout, int stage, int li, std::size_t k) {
    const auto& L = layout.layers()[li];
    return stage == 0 ? layout.buckets()[L.buckets[k]].flat_offset - L.flat_offset : L.shard_offsets[k];
  }
  const Arrays& resident(int li) const { return layers_[li].arrays; }
  // Element `at` (in the layer's state) of v, one of a resident layer's exp_avg_sq arrays, and
  // that array's elements. Muon keeps no exp_avg_sq for its hidden matrices: in device memory
  // and host RAM a layer holding them has a compact v over its other elements (on NVMe the swap
  // files keep Adam's three arrays). `at` must be an element that keeps one.
  void* v_at(int li, void* v, std::size_t at) const;
  std::size_t v_elems(int li) const;
  const Arrays& spare(int li);
  void swap_spare(int li);
  void read(int li, float* master, float* m, float* v);
  // Layer li's masters (fp32) and moments as held: moment_bytes(moment_format(), elems(li))
  // bytes each. From NVMe, where the swapper hands out values, the moments are coded back
  // (the same values: moment_format.h).
  void read_held(int li, float* master, void* m, void* v);
  void write(int li, const float* master, const float* m, const float* v);
  void commit_writes();
  void discard_writes() noexcept;
  // The NVMe state as a checkpoint links it (nothing without NVMe state): layer li's sealed
  // files (its sub-groups' committed files, each with the elements it holds), and the run's swap
  // files for a save's room check.
  std::vector<offload::OptimizerSwapper::SealedFile> sealed_files(int li) const;
  std::optional<checkpoint::LinkedRun> linked_run() const;
  // The synchronous optimizer step over the layers on NVMe: fn(li, g) on each of the
  // swapper's sub-groups in its order, each written back as the swapper pipelines it, and
  // the step's traffic added to `io`; when the overlapped step's lane already wrote this step's
  // state (the swapper's pending step, kept), that commits instead. Nothing without
  // NVMe state.
  void step_swapped(const std::function<void(int li, const offload::SubGroup& g)>& fn, IoStats& io);
  // The overlapped step's lane over the layers on NVMe (lane_run.h), in layer ids:
  // has_swapped() (false: none on NVMe), swapped_layers() of them, swap index t's layer;
  // begin_swapped(order) opens the swapper's step in `order` (swap indices), a pull iterator
  // whose sub-groups name swap indices; commit_pending() / discard_pending()
  // keep or drop the writes a deferred commit left pending; committed_masters(li, fn)
  // hands an NVMe layer's current masters to fn(first element, values, count) a sub-group at a
  // time; add_swap_traffic(io) adds the swapper's traffic since it last counted.
  bool has_swapped() const;
  std::size_t swapped_layers() const;
  int swapped_layer(std::size_t t) const;
  offload::OptimizerSwapper::Step begin_swapped(const offload::OptimizerSwapper::StepOrder& order);
  void commit_pending();
  void discard_pending() noexcept;
  void committed_masters(int li,
                         const std::function<void(std::uint64_t first, const float* master, std::uint64_t n)>& fn);
  void add_swap_traffic(IoStats& io);
  // The arrays of layers whose state lives on the device, each replaced by what fn returns
  // (device_swap.h).
  void device_memory(const DeviceSwap::Fn& fn);

 private:
  struct LayerOpt {
    Arrays arrays;
    Arrays spare;  // the overlapped step's (null until first used)
    // A compact v (Muon's): state elements [at, at + n) at element v of the array; the rest of
    // the layer (its hidden matrices) keeps none. Empty: v covers every element.
    struct VRun {
      std::size_t at, n, v;
    };
    std::vector<VRun> v_runs;
  };
  // Layer li's v from (expand) or into (compact) every element's fp32 v, zeros at the elements
  // that keep none.
  void expand_v(int li, const float* compact, float* full) const;
  void compact_v(int li, const float* full, float* compact) const;
  Arrays allocate(int li, const char* what);  // on the layer's tier
  int swap_index(int li) const { return swap_index_.empty() ? -1 : swap_index_[li]; }
  Context c_;
  std::vector<LayerOpt> layers_;
  std::unique_ptr<offload::OptimizerSwapper> swapper_;  // null without NVMe state
  std::uint64_t swap_buffer_bytes_ = 0, swap_file_bytes_ = 0;
  std::vector<int> swap_index_;   // per layer: swapper tensor, or -1
  std::vector<int> swap_layers_;  // per swapper tensor: the layer
};

}  // namespace strata::engine
