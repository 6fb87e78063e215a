// Shared by the engine tests: a config builder, a runner that trains an MLP (the stack of
// tanh layers of stack_trainer.h) on N thread ranks (each with its own host device and Gloo
// communicator) and returns rank 0's final fp32 parameters and memory report, and one MLP rank
// driven by hand.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/config.h"
#include "engine/engine.h"
#include "runtime/device/device.h"
#include "tests/engine/stack_trainer.h"

namespace strata::test {

engine::EngineConfig mlp_config(int stage, int world, DType compute, int micro = 2, int accum = 4);

// A host (emulated) device with these device and pinned budgets, for tests of the engine's parts.
std::unique_ptr<device::Device> host_device(std::uint64_t budget_bytes, std::uint64_t pinned_bytes = 64 << 20);

struct TrainRun {
  std::vector<float> params;                // rank 0's full_parameters() after training
  std::vector<float> initial;               // rank 0's full_parameters() before the first step (read_initial)
  std::vector<double> losses;               // per step
  engine::MemoryReport memory;              // rank 0, after the last step
  std::vector<double> step_ms;              // rank 0
  std::vector<engine::IoStats> io;          // rank 0, per step
  std::string placement;                    // rank 0's explain_placement()
  std::vector<std::int64_t> step_numbers;   // rank 0, StepResult::step per step
  std::vector<engine::StepResult> results;  // rank 0, per step
  std::vector<engine::SaveResult> saved;    // rank 0: what save_checkpoint returned
};

struct TrainSpec {
  engine::EngineConfig config;
  int world = 1;
  int layers = 3;
  int hidden = 32;
  int steps = 10;
  int first_step = 0;         // the data of steps [first_step, first_step + steps): a resumed run's
  std::vector<int> frozen;    // MLP layers frozen (Engine::freeze_layer)
  bool read_initial = false;  // TrainRun::initial (one more full_parameters() before the steps)
  // Called on every rank after each step (its index from 0), with the rank's engine.
  std::function<void(engine::Engine&, int step)> after_step;
  double layer_ms = 0;
  double link_gbps = 0;
  std::vector<double> rank_link_gbps;  // per rank, in place of link_gbps: ranks of unequal speed
  std::uint64_t device_budget = std::uint64_t{256} << 20;
  std::uint64_t pinned_budget = 0;                  // 0: the device's default
  device::Backend backend = device::Backend::host;  // cuda: one rank; the engine's state on the GPU
  bool guard_memory = false;                        // host: device memory out of the CPU's reach (DeviceOptions)
  // A second Gloo communicator as EngineOptions::device_comm (what NCCL is on GPUs): the
  // engine's collectives on device memory go through it.
  bool device_comm = false;
  Tracer* tracer = nullptr;  // rank 0 only
  // Checkpoints: loaded after setup() (its saved step counters continue), saved after the
  // last step (Engine::load_checkpoint / save_checkpoint).
  std::string load_checkpoint, save_checkpoint;
  bool async_save = false;  // SaveOptions::async (waited for before the run ends)
};

TrainRun train_mlp(const TrainSpec& spec);

// The bytes of one kind (optimizer state, gradients, ...) over all three tiers of a report.
std::uint64_t kind_bytes(const engine::MemoryReport& m, engine::Kind k);

// One rank of the MLP (3 layers of `hidden`, seed 7) on a host device, driven step by
// step, so a test can reach the engine and the swap files between steps.
struct MlpRank {
  std::unique_ptr<device::Device> dev;
  std::unique_ptr<engine::Engine> engine;
  std::unique_ptr<StackTrainer> mlp;
  explicit MlpRank(const engine::EngineConfig& c, int hidden = 32);
  ~MlpRank();
  void train(std::int64_t from, std::int64_t to);  // steps [from, to)
};

// A checkpoint's every tensor and state (master, exp_avg, exp_avg_sq; a frozen tensor's master only), consolidated from
// all its files and verified, as raw bytes keyed "name/state": equal maps mean equal state.
std::map<std::string, std::vector<char>> checkpoint_contents(const std::string& path);

}  // namespace strata::test
