// Shared pieces of the executor tests: per-stage parameter stores for a schedule, the
// sequential reference, a bitwise gradient comparison, and the process-rank launcher.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "pipeline/model.h"
#include "pipeline/schedule.h"
#include "runtime/comm/launch.h"

namespace strata::test {

// A zb-auto schedule of uneven times (F 1, B 1.5, W 0.5, comm 0.3) under a limit of p + 1
// micro-batches: W's out of their natural place.
pipeline::Schedule auto_schedule(int p, int m);

// One LocalParameterStore per stage holding that stage's layers (all chunks).
std::vector<std::unique_ptr<pipeline::LocalParameterStore>> stage_stores(const pipeline::Schedule& s,
                                                                         const pipeline::PipelineModel& model,
                                                                         std::uint64_t seed);
std::vector<pipeline::ParameterStore*> pointers(const std::vector<std::unique_ptr<pipeline::LocalParameterStore>>& v);

// "" when every layer `store` holds has the same gradient bits as `reference`, else the
// first difference (layer, index, both values).
std::string compare_grads(const pipeline::LocalParameterStore& store, const pipeline::LocalParameterStore& reference);

// Launches `world` processes of this test binary running the hidden pipeline worker with
// the given environment (STRATA_TEST_* variables) and returns the launcher's result.
comm::LaunchResult run_pipeline_ranks(int world, std::vector<std::pair<std::string, std::string>> env);

}  // namespace strata::test
