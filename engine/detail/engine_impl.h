// The engine's private state: what every phase (setup.cc, checkpoint*.cc) reads (the
// options, the layout, the ledger, the streams), the protocol's flags, the checkpoint
// machinery, and the parts that own the rest (PlacementPlan, ParamHomes, OptimizerState,
// GradReducer, GatherPath, UpdateStaging, NvmeHomes, StepScalars, ShardUpdate,
// OverlappedStep, OptimizerStep), reached only through their interfaces.
#pragma once

#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "checkpoint/format.h"
#include "checkpoint/save_lock.h"
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
  comm::Communicator* comm;
  comm::Communicator* dcomm;  // device-memory collectives (EngineOptions::device_comm)
  int rank = 0, world = 1;
  DType cdt = DType::fp32;
  std::size_t cbytes = 4;
  std::vector<ParamSpec> pending;
  std::vector<int> frozen_ids;  // freeze_layer()
  bool frozen(int li) const { return layout->layers()[static_cast<std::size_t>(li)].frozen; }
  std::uint64_t trainer_reserve = 0;  // reserve_for_trainer()
  int trainer_layers_at_once = 1;
  std::unique_ptr<Layout> layout;
  std::unique_ptr<MemoryLedger> ledger;
  std::size_t layer_count() const { return layout->layers().size(); }
  bool device_collectives() const noexcept { return dcomm != nullptr && world > 1; }
  optim::LossScalerConfig scaler_config;  // StepScalars' scaler, checked when the engine is made
  double initial_loss_scale = 1.0;        // loss_scale() before setup()
  // The NVMe tier (nvme_homes.h): the optimizer swapper (master/m/v of the layers whose
  // optimizer state lives on NVMe; LayerState's master, m and v stay null for them), the
  // parameter store with its I/O worker, the directory locks.
  std::unique_ptr<NvmeHomes> nvme;
  // Each layer's resident parameters and stage-3 shards, and where the shards live now
  // (param_homes.h; the placement plan follows it after a migration).
  std::unique_ptr<ParamHomes> homes;
  offload::ParamStore* param_store() const noexcept { return nvme ? nvme->params() : nullptr; }
  // Where each layer's state goes (placement_plan.h).
  std::unique_ptr<PlacementPlan> plan;
  // Link and NVMe traffic of the current step (counted where issued; parameter write-backs
  // complete on the I/O worker during the next step), and the time waited on it.
  IoStats io, last_io;
  std::chrono::steady_clock::time_point step_start;
  // The engine's own device work, in order: initial values, zeroing, accumulation of
  // gradients that stay on the device, the device optimizer, copies between device buffers.
  // Nothing in the engine touches device memory from the CPU, so every path runs on a real
  // GPU; the host backend runs the same stream work on its worker.
  std::unique_ptr<device::Stream> dev_stream;
  // The gradient path: buffers, reductions, accumulators (grad_reducer.h). After the ledger
  // and the device stream, so that it goes before them.
  std::unique_ptr<GradReducer> grads;
  // Every layer's fp32 master, exp_avg and exp_avg_sq (optimizer_state.h). After the NVMe
  // tier, whose swapper holds the state of the layers on NVMe.
  std::unique_ptr<OptimizerState> opt_state;
  // Where the optimizer writes updated compute copies, and how they reach their tier
  // (update_staging.h).
  std::unique_ptr<UpdateStaging> updates;
  // The step's scalars: the norm, loss scale, clipping, learning rate and step counters
  // (step_scalars.h); the optimizer's arithmetic on each shard (shard_update.h); the
  // overlapped lane and its tail (overlapped_step.h); and the step over the three
  // (optimizer_step.h). Made last in setup(): they work on every part above (the lane's
  // thread on the first two: it goes before them).
  std::unique_ptr<StepScalars> scalars;
  std::unique_ptr<ShardUpdate> update;
  std::unique_ptr<OverlappedStep> overlap;
  std::unique_ptr<OptimizerStep> stepper;
  std::int64_t step_calls() const noexcept { return scalars ? scalars->calls() : 0; }
  bool in_step = false;
  bool in_eval = false;      // between begin_eval() and end_eval(): gathers only, no trace
  bool grads_stale = false;  // a step failed past its checks: begin_step() zeroes its gradients

  // NVMe parameter reads and write-backs run on the NVMe tier's I/O worker: the read of the
  // next layer overlaps the all-gather and H2D copy of this one (the gather stream waits on
  // the read's ticket); FIFO order keeps each layer's write-back (and the commit after the
  // last) ahead of its next read. A write-back frees its staging when done, failed or skipped.
  void drain_io();  // the I/O worker's synchronize() (rethrows a failed read or write)
  // Waits for the overlapped step's tail (overlapped_step.h). Outside a step its traffic
  // joins the last completed step's figures (io_stats()), where nothing else would count it.
  void finish_tail();
  // Waits for each stream's queued work (null ones skipped), and the NVMe I/O worker's,
  // before what it touches goes; a failure is logged as `when` ("" : not logged), not thrown.
  void settle(std::initializer_list<device::Stream*> streams, const char* when) noexcept;
  // Stage 3: the gathers, their prefetch and the recorded trace (gather_path.h). After the
  // NVMe tier, whose reads its gathers wait for, so that it goes first.
  std::unique_ptr<GatherPath> gather_path;
  void make_gather_path();

  Impl(const EngineOptions& o);
  bool setup_done() const noexcept { return layout != nullptr; }
  bool setup_complete = false;  // setup() returned: every part exists
  // offload_states() moved the device's bytes to host RAM (device_swap.h); reload_states() undoes it.
  std::unique_ptr<DeviceSwap> offloaded;
  void walk_device_memory(const DeviceSwap::Fn& fn);  // every part holding device memory between steps
  void require_setup(const char* op) const;
  void require_complete_setup(const char* op) const;  // a step or evaluation may begin

  // Layout helpers.
  std::size_t own_begin(const Bucket& b) const { return static_cast<std::size_t>(rank) * b.shard; }
  std::size_t bucket_pos(const Bucket& b, const LayerLayout& L) const { return b.flat_offset - L.flat_offset; }
  void fill_init(const LayerLayout& L, std::size_t begin, std::size_t count, float* out) const;
  std::vector<TensorView> views(int li, void* base, DType t) const;

  bool acc_on_host(int li) const { return plan->acc_on_host(li); }
  // setup.cc
  struct InitScratch {  // host buffers reused from layer to layer
    std::vector<float> init, master_shard;
  };
  void check_same_model() const;                      // every rank registered the same parameters in the same order
  void allocate_step_buffers();                       // reduction scratch, gradient staging, streams, NVMe stores
  void init_layer(std::size_t li, InitScratch& buf);  // allocates and initialises layer li's state
  void make_stepper();
  // engine.cc: step()'s protocol checks, and the placement's check against the first trace.
  void check_step_ready() const;                    // every layer reduced each micro-batch and released
  std::vector<float> layer_values(std::size_t li);  // collective: the padded layer's fp32 values (engine.cc)
  void replan_on_first_trace();
  // checkpoint.cc. A run of a layer's flat buffer held in one of its state arrays: array
  // index, position in the layer's padded flat buffer, elements.
  struct Piece {
    std::size_t index, pos, len;
  };
  // What this rank saves of layer li (its shard of every bucket, at every stage), or, with
  // `whole`, the whole padded layer as a full array holds it.
  std::vector<Piece> pieces(int li, bool whole) const;
  std::string engine_state_json() const;
  // checkpoint_load.cc: the counters a checkpoint's engine state restores, checked against
  // this run (optimizer type, loss scaling); throws naming the mismatch.
  StepScalars::Counters loaded_counters(const checkpoint::Manifest& m, const std::string& where) const;
  // Collective: every rank's outcome of its part of an operation; the lowest failing rank,
  // or -1 when every rank succeeded.
  int first_failure(bool ok);
  // Collective: runs fn; if it failed on any rank, every rank runs on_failure and throws
  // (its own error, or one naming `what` and the failing rank).
  void all_or_nothing(const std::function<void()>& fn, const std::string& what,
                      const std::function<void()>& on_failure = {});
  using Appender = std::function<std::uint64_t(const void* data, std::uint64_t bytes)>;
  checkpoint::Manifest build_part(const std::string& staging, std::int64_t step, const std::string& trainer_state,
                                  bool link_nvme, SaveResult& counts, const Appender& append);
  std::uint64_t shard_file_bytes(bool link_nvme) const;  // what build_part appends
  // Room for the NVMe files a save of `step` under `root` links (checkpoint.cc).
  void check_link_space(const std::string& root, std::int64_t step, int keep) const;
  std::string write_part(const std::string& staging, std::int64_t step, const std::string& trainer_state,
                         bool link_nvme, SaveResult& counts);
  void commit_parts(const std::string& root, const std::string& part_text, int keep);
  void sum_counts_over_ranks(SaveResult& r);  // collective: bytes, linked and copied bytes
  // checkpoint_async.cc: a save being written in the background (SaveOptions::async).
  struct PendingSave {
    std::string root;
    int keep = 0;
    checkpoint::Manifest part;  // file 0 described when the writer is done
    std::vector<char> staging;  // the shard file's bytes, charged to the host tier
    std::uint64_t charged = 0;
    std::thread writer;
    std::atomic<bool> done{false};
    std::exception_ptr error;  // the writer's
    checkpoint::FileEntry file;
    SaveResult result;
    std::chrono::steady_clock::time_point t0;
  };
  std::unique_ptr<PendingSave> pending_save;
  // The save roots this run has saved to, each locked against other runs until the engine
  // goes (checkpoint/save_lock.h); rank 0 only, which prepares and commits.
  std::vector<std::unique_ptr<checkpoint::SaveLock>> save_locks;
  void lock_save_root(const std::string& root);
  std::uint64_t host_transient = 0;  // host bytes the steps need above their steady use
  bool staged_before = false;        // once staging was charged, the host peak includes it
  std::vector<SaveResult> finished_saves;
  // Collective. Stages a save and starts its writer; false (on every rank) when some rank's
  // staging does not fit the host budget: the caller saves synchronously.
  bool start_async_save(const std::string& root, std::int64_t step, const std::string& trainer_state,
                        const SaveOptions& opts, SaveResult& out);
  // Collective. Commits the pending save once every rank's writer is done (wait: waits for
  // them) or abandons it when one failed; the outcome goes to finished_saves.
  void poll_save(bool wait);
  void drop_pending_save() noexcept;  // shutdown: joins the writer, frees the staging
  using StateReader = std::function<void(int param, int state, std::uint64_t elem, std::uint64_t count, float* out)>;
  // Where a load's moments come from: zeros, the reader (states 1 and 2), or the state as it
  // is (write_weights: read back first and written again with the new masters).
  enum class Moments { zero, read, kept };
  // before_layer(li), when given, runs on every rank before layer li is read (write_weights'
  // broadcast of the modifier rank's values).
  void load_layers(const StateReader& read, Moments moments, bool apply,
                   const std::function<void(std::size_t li)>& before_layer = {});
  // Collective: the step directory a load of `path` reads, as rank 0 resolves it.
  std::string resolve_checkpoint(const std::string& path, const std::string& what);
  // Collective: load_layers read-only, then applied (on_success after it, on every rank)
  // and committed; a failure in either phase changes nothing but NVMe writes discarded.
  void load_all_or_nothing(const StateReader& read, Moments moments, const std::string& what,
                           const std::function<void()>& on_success = {},
                           const std::function<void(std::size_t li)>& before_layer = {});
  void commit_loaded();            // the staged NVMe writes of a load become current
  void discard_loaded() noexcept;  // they are dropped; the state is marked mixed
  // A load failed while writing: memory may hold part of it. begin_step() refuses until a
  // load succeeds.
  bool state_mixed = false;
};

}  // namespace strata::engine
