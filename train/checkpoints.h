// `strata train`'s checkpoints: --save-dir/--save-every/--keep (or the config's
// "checkpoint" block, which the flags override), --resume DIR|latest, and --init-from
// model.safetensors (weights to start from, e.g. from `strata export`). The trainer's
// part of a checkpoint is the next step to run (the data position: both models draw step
// s's batch from (seed, s) alone), the seed and the model's own state (TrainModel::state:
// the GPT's FP8 amax histories); the engine's part is everything else.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "engine/config.h"
#include "engine/engine.h"
#include "models/safetensors.h"
#include "train/model.h"

namespace strata::comm {
class Communicator;
}

namespace strata::train {

struct CheckpointFlags {
  std::string save_dir, resume, init_from;
  std::int64_t save_every = -1;  // -1: the config's
  int keep = -1;                 // -1: the config's
  bool async = false;            // or the config's checkpoint.async
};

// The line for a committed save: where, how much, how fast, and the NVMe state linked.
void print_saved(const engine::SaveResult& r);

// --init-from's check, for the plain and the pipelined trainer: `file` (opened from --init-from
// `path`) holds exactly the tensors `wanted` (name, shape; the model's, in its order), each with
// its shape. Throws Errc::invalid_argument naming the first tensor missing, of another shape,
// or that the model does not register.
using WantedTensors = std::vector<std::pair<std::string, std::vector<std::int64_t>>>;
void check_init_file(const model::SafetensorsReader& file, const std::string& path, const WantedTensors& wanted);
// Elements [elem, elem + count) of tensor `t` of the --init-from `file` (at `path`) as fp32,
// refusing a NaN or an infinity with Errc::invalid_argument naming the tensor and the first
// such element: from such weights every step overflows, the loss scaler skips them all and
// the run would end with exit 0 having trained nothing.
void read_init_values(model::SafetensorsReader& file, const std::string& path, const model::TensorInfo& t,
                      std::uint64_t elem, std::uint64_t count, float* out);

// Refuses a run resumed at step `first` whose --steps leaves nothing to train (it would end
// at once with exit 0): --steps is the total to reach. Plain and pipelined runs alike.
void require_steps_after_resume(std::int64_t first, std::int64_t steps, const std::string& resume);

class TrainCheckpoints {
 public:
  TrainCheckpoints(const CheckpointFlags& flags, const engine::CheckpointConfig& config, std::uint64_t seed,
                   TrainModel& model);
  // Loads --resume or --init-from (after engine.setup()) and returns the first step to run
  // (0 unless resumed). Throws naming the flag when the checkpoint was trained with another
  // seed, or naming the tensor that --init-from's file lacks, has extra or mis-shaped.
  std::int64_t resume(engine::Engine& engine) const;
  // After step index s (0-based) of `steps`: saves when due; rank 0 prints where and how
  // fast, and how the asynchronous saves that finished since went.
  void after_step(engine::Engine& engine, std::int64_t s, std::int64_t steps) const;
  // Collective, at step index s before it runs: when any rank was interrupted (Ctrl-C,
  // SIGTERM), every rank saves the state after s steps (when saving is on and something is
  // new since the last save) and then throws, naming the checkpoint. The agreed flag is the
  // only check while saving is on: a signal that lands after this rank's vote waits for the
  // next step's, so no rank stops alone. Without saving, a signal throws on its own rank.
  void stop_if_interrupted(engine::Engine& engine, comm::Communicator* comm, std::int64_t s, std::int64_t first) const;
  // After training: waits for an asynchronous save and reports it. Throws when the last
  // save failed, so the run does not end as if its state were kept.
  void finish(engine::Engine& engine) const;

 private:
  void init_from(engine::Engine& engine) const;
  void report(engine::Engine& engine, bool throw_on_failure) const;
  engine::SaveResult save(engine::Engine& engine, std::int64_t next_step, bool async) const;
  std::string save_dir_, resume_, init_from_;
  std::int64_t save_every_ = 0;
  int keep_ = 0;
  bool async_ = false;
  std::uint64_t seed_ = 0;
  TrainModel* model_;
};

}  // namespace strata::train
