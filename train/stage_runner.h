// One stage of one replica of a pipeline on a ZeRO engine, for `strata pipeline --config`
// (pipeline_engine.h) and `strata train --pipeline-stages` (pipelined.h): the stage's
// device, its config with the NVMe paths moved into a subdirectory of its own
// ("stage<s>"), the engine over the stage's data-parallel group and linked to the
// replica's other stages (the gradient norm over the whole model), the StageStore and the
// executor.
//
// Protocol. The constructor takes the pool for the schedule's activations
// (pipeline::stage_memory, engine::StageStore::setup), sets the engine up beside it and
// gives the layers their initial values (collective over the stage's group). step() runs
// one step; reschedule(s) runs another schedule of the same stages, chunks and
// micro-batches from the next step (zb-auto from measured times), refused with
// Errc::out_of_budget when it has more buffers of some size live at once than the pool
// holds; start_at(s) numbers the next step s (a resumed run). forward() runs a
// forward-only pass between steps (pipeline/forward.h, inside the engine's begin_eval /
// end_eval; every stage of the replica calls it alike). parameters() and summary()
// describe the stage after a step.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "pipeline/executor.h"
#include "pipeline/model.h"
#include "pipeline/schedule.h"
#include "pipeline/transport.h"
#include "runtime/comm/communicator.h"
#include "runtime/core/trace.h"
#include "train/pipeline_engine.h"

namespace strata::engine {
class Engine;
class StageStore;
}  // namespace strata::engine

namespace strata::train {

class StageRunner {
 public:
  StageRunner(const pipeline::Schedule& schedule, const pipeline::PipelineModel& model, const EngineStagesOptions& o,
              int stage, comm::Communicator* group, comm::Communicator* pipe, pipeline::Transport& transport,
              Tracer* tracer = nullptr);
  ~StageRunner();
  StageRunner(const StageRunner&) = delete;
  StageRunner& operator=(const StageRunner&) = delete;

  pipeline::StageReport step();
  void reschedule(const pipeline::Schedule& schedule);
  // The next step() is step `step` of the run (after a resume: the model's data follows it).
  void start_at(std::int64_t step);
  // `model`: the stage's own (null), or the same layers built for other rows (a sampler's
  // shorter sequences; the same ids and parameter counts).
  void forward(int micro_batches, const std::function<void(int micro, float* x)>& input,
               const std::function<void(int micro, const float* y)>& output,
               const pipeline::PipelineModel* model = nullptr);
  pipeline::Transport& transport();
  std::vector<float> parameters();  // the stage's fp32 masters, its layers in id order
  StageSummary summary() const;     // after the last step
  const std::vector<int>& layers() const;
  engine::Engine& engine();
  const engine::StageStore& store() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A step's executor actions on a stage's trace: compute (F, B, W, BW) and send/recv rows
// (OPT is the engine's own "optimizer" row).
void record_actions(Tracer& tracer, const pipeline::StageReport& report);

// A communicator over `size` ranks of the job's rendezvous under its own run id; null for one.
std::unique_ptr<comm::Communicator> sub_comm(const comm::RendezvousConfig& base, const std::string& name, int rank,
                                             int size);

// The config with its NVMe paths moved into a subdirectory of their own, made here and
// removed when this goes if the engines have left it empty: declare it before the engine.
struct SubdirConfig {
  engine::EngineConfig config;
  std::vector<std::string> made;
  SubdirConfig(engine::EngineConfig c, const std::string& sub);
  ~SubdirConfig();
  SubdirConfig(const SubdirConfig&) = delete;
  SubdirConfig& operator=(const SubdirConfig&) = delete;
};

// A device for a stage or the plain run: the host device with o.device_budget (if set).
std::unique_ptr<device::Device> stage_device(const EngineStagesOptions& o);

}  // namespace strata::train
