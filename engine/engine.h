// The ZeRO engine: Strata's memory manager (docs/design.md, "The engine's parts" and
// "The host-trainer contract"). It owns every parameter, gradient and optimizer shard, places them on tiers,
// gathers parameters before a layer runs and releases them after, reduces gradients in
// buckets during backward, and runs the optimizer where the state lives.
//
// Protocol (one rank; every rank makes the same calls in the same order):
//   register_param(...) for every parameter, then setup() (checks that every rank
//   registered the same model, lays it out, allocates and initialises it);
//   per step: begin_step(); for each of gradient_accumulation_steps micro-batches:
//     forward:  views = gather(layer) ... trainer's forward ... release(layer)
//     backward: views = gather(layer); grads = grad_buffers(layer) ... trainer writes dL/dW
//               (times loss_scale()) into grads ...; reduce_grads(layer); release(layer)
//   step(): global gradient norm, overflow skip (fp16), clipping, the optimizer on this
//   rank's shards, and the re-gather of updated parameters (stages 1-2).
//   A step() that fails past its checks ends the step and drops its gradients: queued work
//   finishes, state on NVMe keeps its last committed state and the step count does not
//   move, so with every shard on NVMe the next step runs as if the failed one never had;
//   state updated in place (device, host RAM) keeps its update: resume from a checkpoint
//   (as with optimizer state on NVMe whose step had begun to commit sub-groups because its
//   spare files ran out, offload_optimizer.spare_sub_groups: the engine then refuses to go on).
// Views point into device memory of the engine's Device and stay valid until release()
// (gather) or reduce_grads() (grad buffers). On a CUDA device the trainer's kernels that
// read a view or write a gradient buffer must have completed (its stream synchronized)
// before it calls release() or reduce_grads() on it. Stages 0-3 follow DeepSpeed: 0 replicates
// everything, 1 shards optimizer state and master weights, 2 also gradients, 3 also
// parameters. All stages share one reduction path (per-micro-batch bucket reductions of
// equal length accumulated in fp32), so their parameters are bitwise identical.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/config.h"
#include "engine/layout.h"
#include "offload/ledger.h"
#include "runtime/core/dtype.h"
#include "runtime/core/trace.h"

namespace strata::comm {
class Communicator;
}
namespace strata::device {
class Device;
}

namespace strata::engine {

// The tiers and the ledger live in offload/ (below the engine); the engine speaks of them
// by these names.
using offload::Kind;
using offload::kind_name;
using offload::kKinds;
using offload::kTiers;
using offload::MemoryLedger;
using offload::Tier;
using offload::tier_name;
using offload::TierUsage;

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::fp32;
  std::vector<std::int64_t> shape;
  std::size_t numel = 0;
  const std::string* name = nullptr;
  template <class T> T* as() const noexcept { return static_cast<T*>(data); }
};

struct StepResult {
  std::int64_t step = 0;    // optimizer steps taken so far (skipped ones not counted)
  bool skipped = false;     // overflow: parameters untouched
  double grad_norm = 0.0;   // global norm of the averaged, unscaled gradient
  double loss_scale = 1.0;  // the scale this step's gradients carried
  double clip_coef = 1.0;
  float lr = 0.0f;
  // Overlapped step (offload_optimizer.overlap_step): the update made during backward was
  // undone (overflow or clipping) and the step ran synchronously.
  bool rolled_back = false;
  // Kept with layers the lane had not reached yet: it steps them (lowest first) while the
  // next step's forward runs (the tail, stage 3 with every layer's state on NVMe).
  int tail_layers = 0;
  // Deferred (the last step clipped, gradient_clipping on, stage 3 with every layer's state on
  // NVMe): the lane only read ahead during backward, bet on nothing, and runs this step's
  // update as the tail once the norm was known.
  bool deferred = false;
};

struct MemoryReport {
  TierUsage device, host, nvme;
  std::uint64_t live_gathered_elems = 0;  // stage 3: parameters gathered right now
  std::uint64_t peak_gathered_elems = 0;
  // The Device's own peak: the engine's ledger and what the trainer holds there (activations),
  // in the device's allocation granules.
  std::uint64_t device_memory_peak = 0;
  std::uint64_t parameters = 0;  // the model's registered elements (what "bytes per parameter" divides by)
};

// One step's traffic between tiers (begin_step() to the end of step()), counted where the
// engine issues it: host<->device copies (gathers, gradients leaving the device, updated
// shards returning), NVMe reads and writes (optimizer swapper, parameter store), and the
// time the trainer's thread waited on gathers, swaps and parameter writes.
struct IoStats {
  std::uint64_t h2d_bytes = 0, d2h_bytes = 0;
  std::uint64_t nvme_read_bytes = 0, nvme_write_bytes = 0;
  double io_wait_seconds = 0;
  double step_seconds = 0;  // begin_step() to the end of step()
  // Overlapped step: the time waited for the optimizer lane: in step() (what of the NVMe
  // optimizer was not hidden behind backward) and, behind a kept step's tail, in the next
  // step's gathers of layers the tail had not stepped yet.
  double optimizer_wait_seconds = 0;
  // Adds another count's traffic and waits (not step_seconds): work counted apart, then joined.
  IoStats& operator+=(const IoStats& o) noexcept {
    h2d_bytes += o.h2d_bytes;
    d2h_bytes += o.d2h_bytes;
    nvme_read_bytes += o.nvme_read_bytes;
    nvme_write_bytes += o.nvme_write_bytes;
    io_wait_seconds += o.io_wait_seconds;
    optimizer_wait_seconds += o.optimizer_wait_seconds;
    return *this;
  }
};

struct SaveOptions {
  int keep = 0;  // the newest checkpoints kept under the root (0: all)
  // Optimizer state on NVMe: hard-link its sealed swap files into the checkpoint (copied in
  // the kernel across filesystems); false: read it through host memory into the shard file.
  bool link_nvme = true;
  // Return once the state is staged (host memory within the host budget; NVMe state
  // linked) and write it while training goes on; it is committed at the end of a later
  // step() once every rank's writes have landed (engine/checkpoint_async.cc).
  bool async = false;
};

// What save_checkpoint() wrote (engine/checkpoint_save.h); byte counts of every rank together.
struct SaveResult {
  std::string dir;                      // the committed step directory
  std::int64_t step = 0;                // step() calls so far (the directory's number)
  std::uint64_t bytes = 0;              // written to shard files
  std::uint64_t nvme_linked_bytes = 0;  // NVMe optimizer state hard-linked (no bytes moved)
  std::uint64_t nvme_copied_bytes = 0;  // NVMe optimizer state copied file to file (another filesystem)
  double seconds = 0;                   // wall time of the whole save, commit included
  // Asynchronous saves: save_checkpoint returns committed = false and `seconds` the time
  // training was held up; finished_checkpoints() reports the outcome (seconds: the whole
  // save), committed, or not with the error.
  bool async = false;
  bool committed = true;
  std::string error;
};

struct EngineOptions {
  EngineConfig config;
  device::Device* device = nullptr;    // required
  comm::Communicator* comm = nullptr;  // null: a single rank
  // Collectives on device memory (NCCL on GPUs), for world > 1: the reduction of gradients
  // whose accumulator is on the device (reduce-scatter, then all-gather at stages 0-1, so
  // every stage sums alike), stage-3 gathers (each rank's shards cross the link, the layer
  // is all-gathered in device memory), stages 1-2's re-gather and the refresh of persistent
  // layers. `comm` keeps the collectives on host memory (gradients of offloaded optimizers,
  // the global norm, checks, full_parameters). Same ranks as `comm`. Required on a CUDA
  // device with world > 1; optional on the host device (where it gives the same bits).
  comm::Communicator* device_comm = nullptr;
  // Pipeline stages (engine/stage_store.h): the engines of one data-parallel replica's
  // stages, rank = stage, each holding its stage's layers. step()'s gradient norm (clipping,
  // the overflow check) then covers the whole model: every stage's per-bucket partials are
  // gathered and added in layer-id order, the order one engine over every layer adds them.
  comm::Communicator* pipeline_comm = nullptr;
  std::uint64_t seed = 0;
  Tracer* tracer = nullptr;  // optional timeline ("compute" lane is the trainer's)
};

class Engine {
 public:
  explicit Engine(const EngineOptions& options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // lr_scale multiplies the learning rate of this parameter's updates (layout.h, ParamSpec).
  int register_param(const std::string& name, std::vector<std::int64_t> shape, int layer, ParamInit init = {},
                     float lr_scale = 1.0f);
  // Before setup(): layer `layer` is frozen (a pretrained base under LoRA adapters, frozen
  // embeddings): its parameters are held only in the compute dtype, where the placement puts
  // parameters (stage 3: sharded, on any tier), gathered and released as every layer's, and
  // never take a gradient or optimizer state: grad_buffers() and reduce_grads() refuse it,
  // step() and its gradient norm skip it, and it keeps its values bit for bit. Checkpoints
  // store its values (widened to fp32) without moments. setup() refuses an id no parameter
  // was registered under.
  void freeze_layer(int layer);
  void setup();
  // Before setup(): what the trainer will need on the device during steps beyond what it
  // holds now: `device_bytes` it will allocate later (a trainer that allocates as it goes;
  // a pipeline stage holds its pools already and passes 0) and `layers_at_once` layers it
  // keeps gathered together (a pipeline action's chunk). The
  // placement is checked against the room that leaves, and the engine's buffers, prefetch
  // and retention never take the reserved bytes.
  void reserve_for_trainer(std::uint64_t device_bytes, int layers_at_once = 1);

  void begin_step();
  std::vector<TensorView> gather(int layer);
  void release(int layer);
  // Forward-only passes (validation, generation) between steps: gather() and release() in
  // any order, no gradients, the recorded trace and its prefetch untouched.
  void begin_eval();
  void end_eval();
  std::vector<TensorView> grad_buffers(int layer);
  void reduce_grads(int layer);
  StepResult step();
  // Drops the step (or the evaluation) in progress, for a trainer whose forward or backward
  // failed midway: every gather not yet released is released, gradient buffers handed out
  // are dropped unreduced, the gradients reduced so far in the step are discarded (zeroed
  // before the next step, every micro-batch's), an overlapped optimizer's work for the step is
  // undone; nothing is updated and the step counters do not move, so the next begin_step()
  // runs as if the dropped step had never begun. The views of the dropped step are invalid.
  // Outside a step or an evaluation it does nothing. With several ranks every rank drops the
  // same step: the reductions already issued are collectives the others take part in.
  void abandon_step();

  // The factor the trainer multiplies the loss gradient by (fp16 dynamic scaling; else 1).
  float loss_scale() const noexcept;
  DType compute_dtype() const noexcept;
  int rank() const noexcept;
  int world_size() const noexcept;
  int pipeline_stages() const noexcept;  // EngineOptions::pipeline_comm's world size (1 without)
  const EngineConfig& config() const noexcept;
  device::Device& device() const noexcept;  // where gather() and grad_buffers() views point
  const Layout& layout() const;             // after setup()
  std::vector<int> layer_ids() const;
  MemoryReport memory() const;
  IoStats io_stats() const;  // the last completed step
  // Waits for the engine's background work: prefetched gathers, reductions and the NVMe
  // write-back of updated parameter shards that step() leaves running into the next step.
  // Rethrows a failure of that work. Call it before touching swap files or the process ends.
  void synchronize();
  // Between steps: every byte the engine holds on the device (resident parameters and
  // device shards, device optimizer state, gradient accumulators and scratch; gathered layers
  // are dropped) moves to host RAM within the host budget, what does not fit there to NVMe
  // under the nvme_path (device_swap.h), so the device's memory is free for other work
  // (generation beside RL training, another model); reload_states() brings it back bit for
  // bit. All-or-nothing: what cannot be held (no nvme_path, a full drive) is refused naming the
  // bytes, and what moved comes back. Until reload_states() every call that would touch the
  // state refuses. Per rank (no collective). Returns the bytes moved and the seconds taken.
  struct StateMove {
    std::uint64_t bytes = 0;
    std::uint64_t nvme_bytes = 0;  // of them, to or from NVMe
    std::size_t allocations = 0;
    double seconds = 0;
  };
  StateMove offload_states();
  StateMove reload_states();
  bool states_offloaded() const noexcept;

  // After setup(): what lives on which tier and why (static DeepSpeed placement or the
  // budget-driven plan), a few lines of text.
  std::string explain_placement() const;

  // The whole model's fp32 master weights in registration order (unpadded), gathered to
  // every rank; for saving and comparing runs. Collective: every rank must call it.
  std::vector<float> full_parameters();
  // One layer's fp32 values (its parameters in registration order, unpadded; a frozen layer's
  // compute-dtype values widened) on every rank: full_parameters() a layer at a time, for
  // readers whose memory is bounded by a layer. Collective.
  std::vector<float> layer_parameters(int layer);

  // Checkpoints (checkpoint/ holds the format and the directory protocol). Both are
  // collective and run between steps (after setup(), outside begin_step()/step() and
  // begin_eval()/end_eval()).
  // save_checkpoint writes every rank's shards of the fp32 master weights and optimizer
  // moments, unpadded, with the step counters and loss-scaler state, under root/step-N
  // (N = step() calls so far), commits it atomically, points root/latest at it and keeps
  // the newest options.keep. Optimizer state on NVMe is linked, not copied (SaveOptions),
  // when the filesystem of nvme_path has room for the copy training later writes (else the
  // save is refused naming the bytes). The first save to a root locks it for this engine's
  // life: another run's save there is refused naming the holder. trainer_state is a JSON
  // object stored as is (the data position, seeds); the optimizer type and loss scaling
  // are recorded. A failure on any rank fails it on every rank and leaves the previous
  // checkpoint latest. Nothing the engine does later changes a committed checkpoint.
  SaveResult save_checkpoint(const std::string& root, const std::string& trainer_state = "{}",
                             const SaveOptions& options = {});
  // Asynchronous saves that finished since the last call (committed, or failed with the
  // previous checkpoint still latest), oldest first.
  std::vector<SaveResult> finished_checkpoints();
  // Collective: waits for a pending asynchronous save and commits it (a failure is reported
  // through finished_checkpoints(), not thrown). Call it before the end of training.
  void wait_checkpoint();
  // load_checkpoint reads a checkpoint (root: the one `latest` names; or a step directory)
  // saved at any world size, stage or placement: each rank takes its shards of every
  // tensor's master weights and moments, its compute-dtype parameters are rebuilt from the
  // masters, and the step counters and loss scaler continue where the save left them.
  // Every registered tensor must be in it with the same shape and nothing else may be, and
  // its optimizer must keep the same state (Adam and AdamW do; Lion's is refused for AdamW);
  // a loss scaler of another kind (an fp16 run from a bf16 checkpoint) starts from this
  // run's config. Returns the trainer_state saved with it. All-or-nothing: every byte is
  // read and verified on every rank before any state changes, so a damaged, truncated or
  // mismatched checkpoint leaves the engine as it was (engine/checkpoint_load.cc). Only an
  // I/O error while writing the state leaves it partly loaded, and begin_step() then
  // refuses until a load succeeds.
  std::string load_checkpoint(const std::string& path);
  // Starts training from given weights (a pretrained or exported model): right after
  // setup(), read(name, first element, count, out) is asked for the fp32 values of every
  // registered tensor in ranges of this rank's choosing (twice: a read-only pass first, so
  // an error leaves the initial weights); moments start at zero. Collective.
  using WeightReader =
      std::function<void(const std::string& name, std::uint64_t elem, std::uint64_t count, float* out)>;
  void init_weights(const WeightReader& read);
  // Between steps: new values for every registered tensor, asked for as init_weights asks
  // (masters and compute copies rewritten; a frozen layer's compute copies), with the
  // optimizer moments and the step counters kept: a trainer that edits the full parameters
  // (DeepSpeed's GatheredParameters with a modifier rank) writes them back. All-or-nothing
  // as a load. Collective. source_rank >= 0: only that rank's reader is asked (for every
  // element, a layer at a time) and its values are broadcast; -1: each rank's reader gives
  // the elements it owns (every rank must give the same values).
  void write_weights(const WeightReader& read, int source_rank = -1);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::engine
