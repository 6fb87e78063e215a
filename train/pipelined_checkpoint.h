// Checkpoints of `strata train --pipeline-stages` (pipelined.h): every stage's engine
// saves its own shards under <root>/stage<s> (its step-N directories and `latest`, the
// engine's protocol), with the trainer's state beside them: the next step, the seed, the
// stage count, the GPT's unit scaling and, with fp8, the amax histories of the stage's FP8
// products (the sites of its own layers; the others' stay empty). A resume takes, over every rank, the newest step
// that every stage saved (a run stopped between two stages' saves leaves some a save ahead;
// they still hold the older one unless `keep` removed it, and then the resume is refused
// naming the step) and checks it was saved by as many stages with the same seed and
// parametrization. Saves are collective over each stage's data-parallel group; with `async`
// (--save-async, checkpoint.async) each stage's engine stages its state and writes it while
// training goes on, committing it at a later step of its own, so the stages may commit a
// step apart: a resume takes the newest step every stage committed, as above. finish()
// waits for a stage's last save. --init-from (weights under the plain trainer's tensor
// names, e.g. its --save-params or strata export) gives every stage's layers their initial
// values in place of the seed's.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "engine/stage_store.h"
#include "runtime/comm/communicator.h"
#include "train/pipelined_model.h"

namespace strata::engine {
class Engine;
}
namespace strata::model {
class Fp8Products;
}

namespace strata::train {

struct PipelineCheckpoints {
  std::string save_dir;  // empty: no saving
  std::string resume;    // a save root: every stage's latest under it
  std::int64_t save_every = 0;
  int keep = 0;
  std::uint64_t seed = 0;
  int stages = 1;
  bool async = false;
  std::string init_from;     // --init-from: empty, or a safetensors file of the model's tensors
  bool unit_scaled = false;  // the GPT's parametrization, recorded and checked as the plain trainer does
  // The model's own state (PipelinedModel::state, saved under "model") and its check on resume.
  std::string model_state;
  std::function<void(const std::string& saved)> check_model_state;

  // --init-from: checks the file holds exactly `model.tensors` with their shapes (Errc::
  // invalid_argument naming the tensor and what to do), then returns what writes a pipeline
  // layer's stored parameters from it (each call reads the file itself: stages call it from
  // their own threads at once). Empty without --init-from.
  engine::StageStore::LayerValues initial_values(const PipelinedModel& model) const;

  // Loads stage `stage`'s checkpoint of the newest step every stage saved under `resume`
  // into `engine`, and its FP8 histories into `fp8` (null: no fp8), and returns the next step
  // (0 without --resume). Collective over `all` (every rank). Throws Errc::invalid_argument
  // naming the flag when the stages share no step or the checkpoint is not this run's (stage
  // count, seed, unit scaling, FP8 sites); a checkpoint saved without fp8 gives fp8 fresh
  // scales, with a note.
  std::int64_t load(engine::Engine& engine, int stage, comm::Communicator* all, model::Fp8Products* fp8) const;
  // After step index s (0-based) of `steps`: saves stage `stage` when due (returns true
  // when it did), and reports the stage's asynchronous saves that finished: a committed one
  // when `printer`, a failed one always (the stage's previous checkpoint stays latest).
  bool after_step(engine::Engine& engine, int stage, std::int64_t s, std::int64_t steps, bool printer,
                  const model::Fp8Products* fp8) const;
  // At the end of the run: waits for the stage's pending asynchronous save and reports it
  // (collective over the stage's data-parallel group); returns why the last one failed, or
  // "" (the caller stops every stage alike: finish_all()).
  std::string finish(engine::Engine& engine, int stage, bool printer) const;
  // finish(), then over every rank of `all` (rank q: stage q / D): when any stage's last save
  // failed, every rank throws Errc::io naming the stages, as the plain trainer does when its
  // last save fails.
  void finish_all(engine::Engine& engine, int stage, int D, comm::Communicator* all, bool printer) const;
  std::string stage_root(const std::string& root, int stage) const;
};

}  // namespace strata::train
