// `strata pipeline --config FILE`: the schedule's stages on ZeRO engines
// (engine/stage_store.h) instead of local parameter stores.
//
// Protocol. P stages x D replicas, as threads of this process or as the ranks of a launched
// job (world = P * D; rank r is stage r / D of replica r % D). Each stage's engine runs
// over that stage's data-parallel group of D ranks (Gloo), and the engines of one replica's
// stages share a pipeline communicator (the gradient norm over the whole model). A
// replica's stages exchange activations through mailboxes (threads) or a third
// communicator over those stages (ranks). Replica d trains on its own inputs
// (model_of(d)). With verify, the same engines' config trains a plain data-parallel run
// over the whole model (D ranks, the plain loop) and every stage's parameters are compared
// with it bit for bit. NVMe paths get a subdirectory per stage ("stage<s>") and one for
// the plain run ("plain").
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "engine/config.h"
#include "pipeline/executor.h"
#include "pipeline/generators.h"
#include "pipeline/model.h"
#include "pipeline/schedule.h"

namespace strata::train {

struct EngineStagesOptions {
  engine::EngineConfig config;  // gradient_accumulation_steps must be the schedule's micro-batches
  int replicas = 1;
  int steps = 2;
  bool verify = false;
  std::uint64_t seed = 1;  // initial parameters (Layer::init_params)
  // Initial parameters from elsewhere (--init-from), in place of the seed's: called from
  // each stage's thread for its layers (engine::StageStore::LayerValues).
  std::function<void(int layer, std::size_t count, float* out)> init_values;
  std::uint64_t device_budget = 0;  // each stage's device; 0: the host device's default
  double link_gbps = 0;             // each stage's host device: H2D/D2H throttled to this (0: not)
  pipeline::ExecutorOptions executor;
  // Threads only: a Chrome trace of replica 0, one process row group per stage with the
  // engine's lanes (gather, reduce, copy, nvme read/write, optimizer) and the executor's
  // (compute: F/B/W of the last step; send/recv).
  std::string trace;
};

// One stage of replica 0 after the last step, as rank 0 prints it.
struct StageSummary {
  double activations = 0;                                // bytes: the schedule's activation peak (replayed)
  double device_peak = 0, host_peak = 0, nvme_used = 0;  // bytes (the engine's ledger)
  double nvme_read = 0, nvme_write = 0;                  // bytes in the last step
  double grad_norm = 0, clip_coef = 1;                   // the last step's
};

struct EngineStagesResult {
  bool reporter = true;                        // this process prints (threads, or rank 0)
  std::vector<pipeline::StageReport> reports;  // replica 0's stages (reporter only)
  std::vector<StageSummary> stages;            // the same
  bool equal = true;                           // verify: every stage matched the plain run
};

// zb-auto under options.device_budget: the largest memory limit (micro-batches of
// activations, the same on every stage, from 2p - 1 down to 1) at which every stage's
// activation pool (pipeline::stage_memory's pool_bytes) plus its engine's device minimum
// (engine::estimate_memory with the stage's layers gathered at once, and the fp32 copies of
// a 16-bit stage) fits the budget.
// Throws Errc::out_of_budget naming the smallest budget when even a limit of 1 does not fit.
struct BudgetedSchedule {
  pipeline::Schedule schedule;
  int memory_limit = 0;
  std::uint64_t need = 0;  // the largest stage's activations plus engine minimum, bytes
};
BudgetedSchedule zb_auto_within_budget(pipeline::AutoOptions auto_options, const pipeline::PipelineModel& model,
                                       const EngineStagesOptions& options);

EngineStagesResult run_on_engines(const pipeline::Schedule& schedule,
                                  const std::function<pipeline::PipelineModel(int replica)>& model_of,
                                  const EngineStagesOptions& options);

}  // namespace strata::train
