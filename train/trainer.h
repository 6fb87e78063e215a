// The plain trainer behind `strata train` (and strata_train in the C API, train/c_train.h):
// the run's ranks, device and engine, the model (model.h), its checkpoints
// (checkpoints.h), and the loop that steps it and reports each step: a line on stdout
// (step_report.h), one JSON object per step in the log, a trace; the final parameters as
// safetensors. With pipe.stages > 0 it hands the run to the pipelined trainer (pipelined.h).
#pragma once

#include <cstdint>
#include <string>

#include "train/checkpoints.h"
#include "train/model.h"
#include "train/pipelined.h"
#include "train/step_report.h"

namespace strata::train {

struct TrainOptions {
  ModelOptions m;
  std::string config;  // a DeepSpeed-style JSON file
  std::int64_t steps = 10;
  std::string log_json, save_params, trace;  // outputs; empty: none
  std::string device = "auto";               // auto|host|cuda
  std::string device_budget = "1GiB";        // when the config has no memory_budget.device
  double link_gbps = 0;                      // host device: H2D/D2H throttled to this (0: not)
  bool explain = false;                      // print the placement
  StepPrinting::Level printing = StepPrinting::Level::normal;
  CheckpointFlags ckpt;
  PipelineTrainOptions pipe;  // pipe.stages > 0: the pipelined trainer, with its schedule
};

// Trains as one rank of the job the environment names (STRATA_WORLD_SIZE and the rendezvous
// `strata launch` sets up; alone without it). Returns 0; throws strata::Error naming the
// option, file or rank at fault (a signal ends it the same way, after a final checkpoint
// where it saves them).
int run_training(const TrainOptions& o);

}  // namespace strata::train
