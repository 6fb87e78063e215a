// Shared executor-test helpers (see common.h).
#include "tests/pipeline/common.h"

#include <cstring>

#include "pipeline/generators.h"
#include "pipeline/runner.h"
#include "runtime/core/error.h"

namespace strata::test {

std::vector<std::unique_ptr<pipeline::LocalParameterStore>> stage_stores(const pipeline::Schedule& s,
                                                                         const pipeline::PipelineModel& model,
                                                                         std::uint64_t seed) {
  std::vector<std::unique_ptr<pipeline::LocalParameterStore>> out;
  for (int st = 0; st < s.stages; ++st)
    out.push_back(std::make_unique<pipeline::LocalParameterStore>(model, pipeline::stage_layers(s, model, st), seed));
  return out;
}

std::vector<pipeline::ParameterStore*> pointers(const std::vector<std::unique_ptr<pipeline::LocalParameterStore>>& v) {
  std::vector<pipeline::ParameterStore*> out;
  for (const auto& p : v) out.push_back(p.get());
  return out;
}

std::string compare_grads(const pipeline::LocalParameterStore& store, const pipeline::LocalParameterStore& reference) {
  for (int id : store.layers()) {
    const auto& a = store.grads_of(id);
    const auto& b = reference.grads_of(id);
    if (a.size() != b.size()) return str_cat("layer ", id, ": ", a.size(), " vs ", b.size(), " elements");
    for (std::size_t i = 0; i < a.size(); ++i) {
      if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0)
        return str_cat("layer ", id, " element ", i, ": pipelined ", a[i], " vs sequential ", b[i]);
    }
  }
  return "";
}

pipeline::Schedule auto_schedule(int p, int m) {
  pipeline::AutoOptions o;
  o.stages = p;
  o.micro_batches = m;
  o.costs = pipeline::Costs::uniform(1, 1.5, 0.5, 0.3);
  o.memory_limit = {p + 1.0};
  o.search_evaluations = 500;
  return pipeline::zb_auto(o);
}

comm::LaunchResult run_pipeline_ranks(int world, std::vector<std::pair<std::string, std::string>> env) {
  comm::LaunchOptions o;
  o.nprocs = world;
  o.command = {"/proc/self/exe", "[.pipeline-worker]"};
  o.capture = true;
  o.only_rank_output = 999;  // quiet; output is captured
  o.grace = std::chrono::milliseconds(5000);
  env.emplace_back("STRATA_COMM_TIMEOUT_MS", "20000");
  o.env = std::move(env);
  return comm::launch_local(o);
}

}  // namespace strata::test
