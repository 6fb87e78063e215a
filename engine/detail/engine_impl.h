// The engine's private state: what every phase (setup.cc, engine.cc) reads (the options,
// the layout, the ledger, the streams), the protocol's flags, and the parts that own the
// rest (PlacementPlan, ParamHomes, OptimizerState, GradReducer, GatherPath, UpdateStaging,
// NvmeHomes, StepScalars, ShardUpdate, OverlappedStep, OptimizerStep, CheckpointSave, CheckpointLoad), reached
// only through their interfaces.
#pragma once

#include <chrono>
#include <functional>
#include <initializer_list>
#include <memory>
#include <vector>

#include "engine/checkpoint_load.h"
#include "engine/checkpoint_save.h"
#include "engine/detail/checkpoint_ranges.h"
#include "engine/device_swap.h"
#include "engine/engine.h"
#include "engine/gather_path.h"
#include "engine/grad_reducer.h"
#include "engine/nvme_homes.h"
#include "engine/optimizer_state.h"
#include "engine/optimizer_step.h"
#include "engine/overlapped_step.h"
#include "engine/param_homes.h"
#include "engine/placement_plan.h"
#include "engine/ranks.h"
#include "engine/shard_update.h"
#include "engine/step_scalars.h"
#include "engine/update_staging.h"
#include "optim/loss_scaler.h"
#include "runtime/comm/communicator.h"
#include "runtime/device/device.h"

namespace strata::engine {

struct Engine::Impl {
  EngineOptions options;
  EngineConfig& cfg = options.config;
  device::Device& dev;
  Ranks ranks;  // EngineOptions::comm, its rank and world size, and EngineOptions::device_comm
  DType cdt() const noexcept { return compute_dtype_of(cfg); }  // the compute copies' dtype
  std::size_t cbytes() const noexcept { return dtype_size(cdt()); }
  // What the trainer declared before setup(): the parameters (register_param), the frozen
  // layers (freeze_layer) and the device room it keeps (reserve_for_trainer).
  struct Declared {
    std::vector<ParamSpec> params;
    std::vector<int> frozen;
    std::uint64_t device_reserve = 0;
    int layers_at_once = 1;
  } declared;
  bool frozen(int li) const { return layout->layers()[static_cast<std::size_t>(li)].frozen; }
  std::unique_ptr<Layout> layout;
  std::unique_ptr<MemoryLedger> ledger;
  std::size_t layer_count() const { return layout->layers().size(); }
  bool device_collectives() const noexcept { return ranks.dcomm != nullptr && ranks.world > 1; }
  optim::LossScalerConfig scaler_config() const;  // StepScalars' scaler, as the config's fp16 block says
  double initial_loss_scale() const { return optim::LossScaler(scaler_config()).scale(); }  // before setup()
  // The NVMe tier (nvme_homes.h): the parameter store with its queued requests, the directory
  // locks (the optimizer state's swapper files lie under one of them).
  std::unique_ptr<NvmeHomes> nvme;
  // Each layer's resident parameters and stage-3 shards (param_homes.h).
  std::unique_ptr<ParamHomes> homes;
  // Where each layer's state goes (placement_plan.h), and the shard map it keeps: where each
  // layer's shards live now, which every part reads (shard_map.h).
  std::unique_ptr<PlacementPlan> plan;
  // Link and NVMe traffic of the current step (counted where issued; parameter write-backs
  // complete on the store's queue during the next step) and the time waited on it, the last
  // completed step's (io_stats()), and when the current step began.
  struct Traffic {
    IoStats io, last;
    std::chrono::steady_clock::time_point step_start;
  } traffic;
  // The engine's own device work, in order: initial values, zeroing, accumulation of
  // gradients that stay on the device, the device optimizer, copies between device buffers.
  // Nothing in the engine touches device memory from the CPU, so every path runs on a real
  // GPU; the host backend runs the same stream work on its worker.
  std::unique_ptr<device::Stream> dev_stream;
  // The gradient path: buffers, reductions, accumulators (grad_reducer.h). After the ledger
  // and the device stream, so that it goes before them.
  std::unique_ptr<GradReducer> grads;
  // Every layer's fp32 master, exp_avg and exp_avg_sq, and the swapper that holds the state of
  // the layers on NVMe (optimizer_state.h). After the NVMe tier, whose lock its files are under.
  std::unique_ptr<OptimizerState> opt_state;
  // Where the optimizer writes updated compute copies, and how they reach their tier
  // (update_staging.h).
  std::unique_ptr<UpdateStaging> updates;
  // The step's scalars: the norm, loss scale, clipping, learning rate and step counters
  // (step_scalars.h); the optimizer's arithmetic on each shard (shard_update.h); the
  // overlapped lane and its tail (overlapped_step.h); and the step over the three
  // (optimizer_step.h). Made last in setup(): they work on every part above (the lane's
  // thread on the first two: it goes before them).
  struct StepParts {
    std::unique_ptr<StepScalars> scalars;
    std::unique_ptr<ShardUpdate> update;
    std::unique_ptr<OverlappedStep> overlap;
    std::unique_ptr<OptimizerStep> run;
  } step;
  std::int64_t step_calls() const noexcept { return step.scalars ? step.scalars->calls() : 0; }
  // Where the trainer is in the contract.
  struct Flags {
    bool setup_complete = false;  // setup() returned: every part exists
    bool in_step = false;
    bool in_eval = false;      // between begin_eval() and end_eval(): gathers only, no trace
    bool grads_stale = false;  // a step failed past its checks: begin_step() zeroes its gradients
    // setup() allocated every layer's state but wrote no values: the first call that reads or
    // keeps them writes the initial ones (write_first_values()), and init_weights() replaces
    // them unwritten, so a run that starts from given weights never draws or stores the
    // initial ones (at 8B parameters, minutes of random draws and a whole write of the tiers).
    bool first_values_pending = false;
  } flags;

  // NVMe parameter reads and write-backs run on the parameter store's queue: the read of the
  // next layer overlaps the all-gather and H2D copy of this one (the gather stream waits on
  // the read's ticket); FIFO order keeps each layer's write-back (and the commit after the
  // last) ahead of its next read. A write-back frees its staging when done, failed or skipped.
  void drain_io();  // the parameter store's synchronize() (rethrows a failed read or write)
  // Waits for the overlapped step's tail (overlapped_step.h). Outside a step its traffic
  // joins the last completed step's figures (io_stats()), where nothing else would count it.
  void finish_tail();
  // Waits for each stream's queued work (null ones skipped), and the parameter store's,
  // before what it touches goes; a failure is logged as `when` ("" : not logged), not thrown.
  void settle(std::initializer_list<device::Stream*> streams, const char* when) noexcept;
  // Stage 3: the gathers, their prefetch and the recorded trace (gather_path.h). After the
  // NVMe tier, whose reads its gathers wait for, so that it goes first.
  std::unique_ptr<GatherPath> gather_path;
  void make_gather_path();

  Impl(const EngineOptions& o);
  bool setup_done() const noexcept { return layout != nullptr; }
  // offload_states() moved the device's bytes to host RAM (device_swap.h); reload_states() undoes it.
  std::unique_ptr<DeviceSwap> offloaded;
  void walk_device_memory(const DeviceSwap::Fn& fn);  // every part holding device memory between steps
  void require_setup(const char* op) const;
  void require_complete_setup(const char* op) const;  // a step or evaluation may begin
  // The initial values written if they are still pending (flags.first_values_pending): what
  // every entry point that reads or keeps values calls, after its own refusals.
  void write_pending_values();

  // Layout helpers.
  std::size_t own_begin(const Bucket& b) const { return static_cast<std::size_t>(ranks.rank) * b.shard; }
  std::size_t bucket_pos(const Bucket& b, const LayerLayout& L) const { return b.flat_offset - L.flat_offset; }
  void fill_init(const LayerLayout& L, std::size_t begin, std::size_t count, float* out) const;
  std::vector<TensorView> views(int li, void* base, DType t) const;

  // setup.cc
  struct InitScratch {  // host buffers reused from layer to layer
    std::vector<float> init, master_shard;
  };
  void check_same_model() const;                      // every rank registered the same parameters in the same order
  void allocate_step_buffers();                       // reduction scratch, gradient staging, streams, NVMe stores
  void add_layer(std::size_t li);                     // allocates layer li's state
  void init_layer(std::size_t li, InitScratch& buf);  // writes layer li's initial values to its tiers
  void write_first_values();                          // every layer's, committed; a failure discards them
  void make_stepper();
  // step()'s protocol checks, and the placement's check against the first trace.
  void check_step_ready() const;                    // every layer reduced each micro-batch and released
  std::vector<float> layer_values(std::size_t li);  // collective: the padded layer's fp32 values
  void replan_on_first_trace();
  // Saves (checkpoint_save.h), and loads and weight writes (checkpoint_load.h). Made last in
  // setup() and reset first: they read and write every part above.
  struct Checkpoints {
    std::unique_ptr<CheckpointSave> saves;
    std::unique_ptr<CheckpointLoad> loads;
  } checkpoints;
  // Collective, before a load: the gathered copies of the old values go (persistent ones are
  // rewritten); a rank that fails makes every rank fail here, before the load's collectives.
  void drop_gathered() {
    detail::all_or_nothing(
        ranks,
        [this] {
          if (gather_path) gather_path->evict_all();
        },
        "dropping the gathered layers before a load (nothing was changed)");
  }
};

}  // namespace strata::engine
