// Running a whole pipeline: every stage as a thread of this process (LocalMailboxes), or
// this process as one stage of a launched job (rank = stage, Gloo send/recv), plus the
// measured timeline both produce, in the simulator's format.
#pragma once

#include <chrono>
#include <vector>

#include "pipeline/costs.h"
#include "pipeline/executor.h"
#include "runtime/comm/communicator.h"

namespace strata::pipeline {

// The layers stage `stage` holds, every chunk, global ids in ascending order (chunk c is
// virtual stage c * p + stage).
std::vector<int> stage_layers(const Schedule& schedule, const PipelineModel& model, int stage);

// Runs `steps` steps with one thread per stage; stores[s] holds stage s's layers. Returns
// the last step's reports, by stage. The first stage to fail aborts the others' receives
// and its error is rethrown here (after every thread has ended).
std::vector<StageReport> run_stages_as_threads(
    const Schedule& schedule, const PipelineModel& model, const std::vector<ParameterStore*>& stores,
    const ExecutorOptions& options = {}, int steps = 1,
    std::chrono::milliseconds recv_timeout = std::chrono::milliseconds(60000));
// The same with models[s] for stage s: copies of one model, for layers that keep state one
// stage's thread may use at a time (the GPT's FP8 products).
std::vector<StageReport> run_stages_as_threads(
    const Schedule& schedule, const std::vector<const PipelineModel*>& models,
    const std::vector<ParameterStore*>& stores, const ExecutorOptions& options = {}, int steps = 1,
    std::chrono::milliseconds recv_timeout = std::chrono::milliseconds(60000));

// Runs `steps` steps of stage comm.rank() (the world size must equal the stage count).
StageReport run_stage_as_rank(const Schedule& schedule, const PipelineModel& model, ParameterStore& store,
                              comm::Communicator& comm, const ExecutorOptions& options = {}, int steps = 1);

// Collects every rank's report on rank 0 (by stage); other ranks get an empty list.
std::vector<StageReport> gather_reports(comm::Communicator& comm, const StageReport& mine);

// Per-stage mean F, B and W times of measured steps (per stage: every chunk's share), for
// the stages in `reports` (the others 0); a BW counts bw_share of its time as B, the rest W.
Costs measured_costs(const Schedule& schedule, const std::vector<StageReport>& reports, double bw_share = 0.5);

// The median time from a send's end to the end of its receive, over the receives that were
// already waiting when the send was posted: what a message costs on this transport (the
// simulator's Costs::comm). 0 when no receive waited.
double measured_comm(const Schedule& schedule, const std::vector<StageReport>& reports);

// The measured timeline: times in seconds from the earliest action's start.
Timeline measured_timeline(const Schedule& schedule, const std::vector<StageReport>& reports);

}  // namespace strata::pipeline
