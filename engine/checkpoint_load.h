// CheckpointLoad: a checkpoint, or weights a trainer hands over, into the engine's state
// (docs/design.md, "Checkpoints"; checkpoint/ holds the format): load(), init_weights() and
// write_weights().
//
// Protocol. Every call is collective and runs between steps once the engine's queued work has
// landed (Engine checks the contract, synchronizes, waits for a pending save before load() and
// write_weights(), and drops the gathered copies of the old values first). A load runs twice over every
// layer: first reading and verifying what this rank will load without changing anything,
// then, when every rank passed, reading again and writing it, the compute copies rebuilt from
// the masters. Writes of NVMe state go to the stores' spare files or other generation and
// commit only when every layer was written (or, optimizer state with fewer spares than
// sub-groups, as they go) (the files a checkpoint hard-linked are never written); a failure
// while writing discards them, and state_mixed() then stays set, for the engine to refuse
// training, until a load succeeds.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "checkpoint/format.h"
#include "engine/config.h"
#include "engine/detail/checkpoint_ranges.h"
#include "engine/engine.h"
#include "engine/layout.h"
#include "engine/optimizer_state.h"
#include "engine/param_homes.h"
#include "engine/step_scalars.h"
#include "optim/loss_scaler.h"

namespace strata::engine {

class CheckpointLoad {
 public:
  struct Context {  // what a load writes and does not own
    const EngineConfig& cfg;
    const Layout& layout;
    Ranks ranks;
    DType cdt = DType::fp32;
    OptimizerState& state;  // masters and moments, wherever they live
    ParamHomes& homes;      // compute copies, rebuilt from the masters
    StepScalars& scalars;   // the counters and loss scaler restored
  };

  explicit CheckpointLoad(const Context& ctx) : c_(ctx) {}
  CheckpointLoad(const CheckpointLoad&) = delete;
  CheckpointLoad& operator=(const CheckpointLoad&) = delete;

  std::string load(const std::string& path);  // returns the trainer's state
  void init_weights(const Engine::WeightReader& read);
  void write_weights(const Engine::WeightReader& read, int source_rank);
  bool state_mixed() const noexcept { return state_mixed_; }

 private:
  // The counters a checkpoint's engine state restores, checked against this run (optimizer
  // type, loss scaling); throws naming the mismatch.
  StepScalars::Counters loaded_counters(const checkpoint::Manifest& m, const std::string& where) const;
  using StateReader = std::function<void(int param, int state, std::uint64_t elem, std::uint64_t count, float* out)>;
  // Where a load's moments come from: zeros, the reader (states 1 and 2), or the state as it
  // is (write_weights: read back first and written again with the new masters).
  enum class Moments { zero, read, kept };
  // Reads every layer from `read` (the ranges this rank owns; the whole layer at stage 0);
  // with `apply`, writes them (NVMe writes staged until commit_loaded()). before_layer(li),
  // when given, runs on every rank before layer li is read.
  void load_layers(const StateReader& read, Moments moments, bool apply,
                   const std::function<void(std::size_t li)>& before_layer);
  std::string resolve(const std::string& path, const std::string& what);  // rank 0's step directory
  // load_layers read-only, then applied (on_success after it, on every rank) and committed; a
  // failure in either phase changes nothing but NVMe writes discarded.
  void load_all_or_nothing(const StateReader& read, Moments moments, const std::string& what,
                           const std::function<void()>& on_success = {},
                           const std::function<void(std::size_t li)>& before_layer = {});
  void commit_loaded();
  void discard_loaded() noexcept;
  std::vector<detail::Piece> pieces(int li, bool whole) const {
    return detail::pieces(c_.layout, c_.cfg.zero.stage, c_.ranks.rank, li, whole);
  }

  Context c_;
  bool state_mixed_ = false;  // a load failed while writing: memory may hold part of it
};

}  // namespace strata::engine
