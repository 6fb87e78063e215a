// `strata train --model gpt|mlp|DIR --pipeline-stages P --schedule KIND`: the model's pipeline
// layers (pipelined_model.h) split over P pipeline stages, each stage's layers on a
// ZeRO engine (stage_runner.h) over its data-parallel group; the schedule's micro-batches
// are the config's gradient_accumulation_steps micro-batches of
// train_micro_batch_size_per_gpu sequences (GPT, Llama) or samples (MLP). Under `strata launch -n
// P*D` rank r is stage r / D of replica r % D; alone, the P stages are threads of this
// process (one replica). Each stage computes on its share of the machine's cores, as on a
// device of its own.
//
// zb-auto runs its first --measure-steps steps as ZB-H1, gathers every rank's per-stage F,
// B and W times (averaged over the replicas, so every replica runs one schedule) and from
// then on runs the schedule zb-auto builds from them, with the largest memory limit (at most
// p micro-batches) whose activations fit what each stage reserved for ZB-H1. Rank 0 prints
// per step the loss (the last stages' losses over every replica), the step time,
// tokens/s, the gradient norm and each stage's memory per tier (replica 0), and writes the
// same to --log-json; --save-params gathers every stage's fp32 parameters and writes them
// under the model's tensor names, as the unpipelined trainer does. Checkpoints: every stage
// saves its own under --save-dir (pipelined_checkpoint.h); --resume continues from the
// newest step every stage saved, bit for bit as if never stopped. --trace records every
// step: per stage the executor's compute and send/recv rows beside its engine's rows
// (gathers, reductions, copies, NVMe, optimizer), the stages as threads in one file with
// one process per stage, under strata launch one file per rank (TRACE.rank<r>). --explain
// prints each stage's placement (what its engine put on which tier and why), stage by
// stage; --link-gbps models each stage's host-device link as the plain trainer's does.
#pragma once

#include <cstdint>
#include <string>

#include "train/checkpoints.h"
#include "train/model.h"
#include "train/step_report.h"

namespace strata::train {

struct PipelineTrainOptions {
  ModelOptions m;
  std::string config;
  std::int64_t steps = 10;
  std::string log_json;
  std::string save_params;  // the final fp32 parameters as the model's named tensors (safetensors)
  CheckpointFlags ckpt;     // --save-dir, --save-every, --keep, --resume, --init-from, --save-async
  std::string trace;        // a Chrome trace: one file (threads), or one per rank (.rank<r>)
  bool explain = false;     // every stage's placement (replica 0's), stage by stage
  StepPrinting::Level printing = StepPrinting::Level::normal;  // --quiet, --verbose (step_report.h)
  double link_gbps = 0;       // each stage's host device: H2D/D2H throttled to this (0: not)
  std::string device_budget;  // each stage's device, when the config has no memory_budget.device
  int stages = 0;
  std::string schedule = "1f1b";
  int chunks = 1;         // interleaved
  int measure_steps = 0;  // zb-auto only; 0: not given (1)
};

// Throws Errc::invalid_argument naming the flag or key that a pipelined run cannot take.
int train_pipelined(const PipelineTrainOptions& o);

}  // namespace strata::train
