// The search behind `strata plan`: every ZeRO stage, optimizer and parameter placement
// (static, or the budget-driven planner where the offload device is left at "none"),
// micro-batch and accumulation for a fixed batch, and re-materialization, for one GPT on the
// host device. Each candidate is a runnable config; it fits when `strata estimate` accepts it
// with its device peak (the engine's ledger plus the model's activations) leaving the largest
// gradient buffer of the device budget free (a full device can hold that many bytes in pieces
// too small for it; at stage 3 the plan narrows the gathered window with
// stage3_max_live_parameters to leave it) and its host peak within 95% of the host budget (at
// a full host tier a gather's staging can come before a write-back frees its own), and its
// step time is predicted from this machine's calibration (calibration.h) and the model's
// training pass profiled at that micro-batch (`strata bench gpt`).
//
// Step-time model, per step of one rank (A micro-batches of m sequences):
//   compute   A x the profiled pass (forward, backward, every gradient) at micro-batch m
//   gradients A x the model's elements x the calibrated gradient path (the trainer's
//             conversion, the reduction and the fp32 accumulation of every micro-batch)
//   optimizer the rank's fp32 master elements / the calibrated CPU AdamW rate (on the host
//             device every tier's optimizer runs on the CPU)
// The ranks on one host share its cores (each computes with all of them, as strata train
// does): the CPU terms (compute, gradients, optimizer) take local_ranks times as long.
//   link      the placement's predicted H2D and D2H bytes (engine/memory_estimate.h) over the
//             calibrated link rates
//   nvme      the predicted NVMe bytes read and written over the calibrated read and write rates
//   comm      (world > 1) each micro-batch's gradients reduced, stage-3 gathers and the
//             stage 1-2 parameter all-gather, over the calibrated bus bandwidths
// and the step is their sum: on a machine with few cores the engine's streams compete with
// the compute for them, so nothing is counted as hidden.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/memory_estimate.h"
#include "train/calibration.h"
#include "train/model.h"

namespace strata::train {

struct PlanRequest {
  ModelOptions model;   // the GPT's shape
  nlohmann::json base;  // the user's config (optimizer, precision, ...), or a default
  int world = 1;
  int local_ranks = 1;  // ranks on this host: they share its cores (strata launch -n N: N)
  int batch = 8;        // sequences per rank per step: micro-batch x accumulation
  std::uint64_t device_budget = 0, host_budget = 0, nvme_budget = 0;
  std::string nvme_path;  // empty: nothing on NVMe
};

struct StepTime {
  double compute = 0, gradients = 0, optimizer = 0, link = 0, nvme = 0, comm = 0;
  double total() const noexcept { return compute + gradients + optimizer + link + nvme + comm; }
};

struct Candidate {
  int stage = 0;
  std::string optimizer = "none", params = "none";  // offload devices; "none" with memory_budget: the planner
  int micro = 1, accum = 1;
  std::string remat = "never";
  DType compute = DType::fp32;      // the config's compute dtype (when it parsed)
  nlohmann::json config;            // runnable with strata train --config
  engine::MemoryEstimate estimate;  // when it fits
  std::uint64_t device_total = 0;   // ledger + activations
  std::string refusal;              // why it does not fit (empty when it does)
  StepTime time;
  std::string label() const;  // "stage 3, optimizer nvme, params auto, 2 x 4, remat always"
};

// Every candidate of the request, in a fixed order, with its config, estimate or refusal.
std::vector<Candidate> plan_candidates(const PlanRequest& r);

// The step time of a fitting candidate whose training pass takes pass_seconds.
StepTime predict_step(const Calibration& cal, const Candidate& c, const PlanRequest& r, double pass_seconds);

// When no candidate fits: for each tier, the smallest budget with which one would (the
// others as given), or 0 where none does; found by bisection over the frugal candidates.
std::vector<std::uint64_t> smallest_budgets(const PlanRequest& r);

}  // namespace strata::train
