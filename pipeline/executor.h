// The pipeline executor: runs one stage's list of a schedule with real layer compute on
// that stage's device (host backend: an emulated GPU whose stream runs the layer code;
// CUDA: layers the model binds to the stage's stream, PipelineModel::bind),
// exchanging activations and gradients through a Transport, and records when each action
// started and ended so the measured bubble can be set against the simulated one.
//
// Protocol. One StageExecutor per stage, owned and driven by that stage's thread (or
// process). run_step() runs the stage's actions in order: F and B/W/BW through the stage's
// layers of the action's chunk, RA/RG receive (blocking), SA/SG send (never blocking), OPT
// calls the ParameterStore. Weight gradients go to the store (add_gradient, once the
// action's layer work has run) in micro-batch order whatever order the schedule runs W in:
// a micro-batch's dW that comes early waits in a buffer until the ones before it are
// handed over, so the sums are the bits of a sequential loop over the micro-batches
// (run_sequential), in a local store or a ZeRO engine's reduction. Re-materialization
// (GPipe/torchgpipe's checkpointing) keeps only a chunk's input after F and recomputes the
// rest before B. A model that ties a weight (PipelineModel::tie) gets a TiedStore in front
// of the store (tie.h): the owner's stage sends the values once a step, the user's sends its
// gradient of them per micro-batch. On a device whose memory the CPU cannot reach
// (device::cpu_reaches: a guarded host device here, CUDA's rule) the executor itself
// touches device memory only through copies and stream work: transfers, the model's input
// and its loss go through a pinned staging buffer. An error in layer code (a sticky stream
// error) or in a transfer leaves run_step with a strata::Error; the executor is not usable
// afterwards.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "pipeline/model.h"
#include "pipeline/schedule.h"
#include "pipeline/timeline.h"
#include "pipeline/transport.h"
#include "runtime/device/device.h"

namespace strata::pipeline {

// always: every micro-batch; except_last: all but the last (whose backward follows its
// forward soonest); never: keep every activation.
enum class Remat { never, always, except_last };
const char* remat_name(Remat r) noexcept;
Remat parse_remat(std::string_view text);  // "never" | "always" | "except_last"

struct ExecutorOptions {
  Remat remat = Remat::never;
  // Receives announced to the transport ahead of the one being waited on (Gloo posts them
  // early, so data moves while the stage computes). 0: post each when it is reached.
  int recv_window = 8;
  device::DeviceOptions device;  // the stage's device; activations and gradients live there
  // A device the caller owns (an engine's, so that parameters and activations share its
  // budget), used in place of making one from `device`; it must outlive the executor.
  device::Device* shared_device = nullptr;
  // Where layers bound to the stage's stream keep their compute state (PipelineModel::bind,
  // bind_bytes each): a device the caller owns that outlives the executor (a ZeRO engine's
  // reservation, engine::StageStore::scratch_device()); null: the stage's device, or the
  // device its pool was cut from.
  device::Device* scratch_device = nullptr;
  // Threads the stage's layer code may use (a TBB arena of its own), so that stages sharing
  // a machine's cores each compute as on a device of their own; 0: the process's pool. A
  // guarded host device runs its stream work on one thread (device::HostStream) and ignores it.
  int compute_threads = 0;
  // The step number of the first run_step() (the model's input and loss see it), for an
  // executor that takes over a run from another (a new schedule).
  std::int64_t first_step = 0;
};

struct StageReport {
  int stage = 0;
  std::vector<TimedAction> timings;  // every action of the step, steady-clock seconds
  double peak_activations = 0;       // micro-batches live at once (a chunk counts 1/v)
  std::uint64_t peak_device_bytes = 0;
  int recomputed = 0;  // forwards re-run by re-materialization
};

class StageExecutor {
 public:
  StageExecutor(const Schedule& schedule, int stage, const PipelineModel& model, ParameterStore& store,
                Transport& transport, const ExecutorOptions& options = {});
  ~StageExecutor();
  StageExecutor(const StageExecutor&) = delete;
  StageExecutor& operator=(const StageExecutor&) = delete;

  StageReport run_step();
  // A forward-only pass between steps (forward.h): `model` null runs the executor's model,
  // else one with the same layers for at most as many rows. `input` writes micro-batch k's
  // input on the first stage; `output` reads its output on the last.
  void forward_pass(int micro_batches, const std::function<void(int micro, float* x)>& input,
                    const std::function<void(int micro, const float* y)>& output, const PipelineModel* model = nullptr);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::pipeline
