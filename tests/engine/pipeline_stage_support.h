// What the pipeline-stage tests share (pipeline_stage_test.cc, pipeline_guard_test.cc, and
// the GPT's in tests/models/gpt_stage_test.cc): a synthetic model per data-parallel replica, the engine config of a
// placement, the plain data-parallel run driven through the engine's own calls, the pipelined run (P stages x D
// replicas as P*D thread ranks, each stage's layers in an engine over its data-parallel
// group), and the bitwise comparison of their parameters.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "pipeline/model.h"
#include "pipeline/schedule.h"

namespace strata::test::pipe {

inline constexpr int kLayers = 8, kMicro = 8, kSteps = 3;
inline constexpr std::uint64_t kInitSeed = 21;
inline constexpr float kClip = 0.05f;  // below the first steps' gradient norm: clipping changes the bits

// Replica d's model: the same layers, its own inputs and targets (its share of the batch).
pipeline::PipelineModel replica_model(int d);
using ModelOf = std::function<pipeline::PipelineModel(int replica)>;

struct Placement {
  int zero = 0;
  engine::OffloadDevice opt = engine::OffloadDevice::none, par = engine::OffloadDevice::none;
  bool overlap = false;         // offload_optimizer.overlap_step: the optimistic step, undone on overflow or clipping
  bool clip = true;             // gradient_clipping kClip, else off
  DType compute = DType::fp32;  // fp16: with a dynamic loss scaler
};
const char* name(engine::OffloadDevice d);
engine::EngineConfig config_for(const Placement& p, int replicas, const std::string& nvme_dir);

using Params = std::map<int, std::vector<float>>;  // by global layer id, replica 0's masters

// The plain data-parallel run: D ranks, one engine each over the whole model, driven
// through the engine's own calls (not StageStore, which it checks).
struct Plain {
  Params params;
  std::vector<double> clip_coefs;   // replica 0's, per step
  std::vector<bool> skipped;        // the same
  std::vector<double> loss_scales;  // the same
};
Plain run_plain(const Placement& p, int replicas, const std::string& dir, const ModelOf& model_of = replica_model);

// The pipelined run: rank r is stage r / D, replica r % D; each replica's stages exchange
// activations through that replica's mailboxes. `steps` (if given) gets replica 0's
// StepResults: [stage][step]. `guard_memory`: every stage's device is a guarded host device
// (device::DeviceOptions::guard_memory), whose memory a CPU access outside stream work
// faults on.
struct PipelinedOptions {
  ModelOf model_of = replica_model;
  std::vector<std::vector<engine::StepResult>>* steps = nullptr;
  std::uint64_t device_budget = 64 << 20;
  bool guard_memory = false;
  bool cuda = false;        // every stage on GPU 0 (the model must bind its layers: PipelineModel::bind)
  int compute_threads = 0;  // ExecutorOptions::compute_threads
  // After the steps, a forward-only pass (StageExecutor::forward_pass) of kMicro micro-batches
  // through forward_model_of(replica) (empty: the trained model), each input the first rows
  // of the trained model's input for step kSteps; replica 0's outputs by micro-batch.
  std::map<int, std::vector<float>>* forward_outputs = nullptr;
  ModelOf forward_model_of;
};
Params run_pipelined(const pipeline::Schedule& s, const Placement& p, int replicas, const std::string& dir,
                     const PipelinedOptions& o = {});
// The smallest device budget under which every stage of `s` sets up and trains (one
// replica, options `o` but their budget): from the largest stage's replayed activations
// (and, on CUDA, its bound kernels' scratch), raised to each refusal's named minimum
// ("at least ... (N B) with what the trainer holds") until the run passes. Fails the test
// when a refusal names no larger minimum.
std::uint64_t named_minimum(const pipeline::Schedule& s, const Placement& p, const std::string& dir,
                            PipelinedOptions o = {});

// Every schedule kind for `stages` stages and kMicro micro-batches.
std::vector<pipeline::Schedule> schedules(int stages);

// "" when every layer's bits match, else the first difference.
std::string compare(const Params& got, const Params& want);

// Each schedule (all of them when `kinds` is empty) at each P and D against the plain run.
void check_schedules(const Placement& p, const std::string& dir, const std::vector<int>& replica_counts,
                     const std::vector<int>& stage_counts, const std::vector<std::string>& kinds = {});

}  // namespace strata::test::pipe
