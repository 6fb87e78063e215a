// CheckpointSave: the engine's state into a checkpoint (docs/design.md, "Checkpoints";
// checkpoint/ holds the format and the directory protocol), synchronously or in the
// background; what each rank's part holds is its CheckpointPart's (checkpoint_part.h).
//
// Protocol. save() is collective and runs between steps once the engine's queued work has
// landed (Engine checks the contract and synchronizes first). It writes this rank's shard of
// every bucket (the same ranges at every stage, padding left out, cut at parameter
// boundaries) and links the sealed NVMe swap files the optimizer state names; each phase ends
// with every rank learning whether every rank succeeded, so a failure anywhere leaves the
// previous checkpoint latest. With SaveOptions::async the bytes are staged in host RAM
// charged to the host tier (or, where some rank's staging does not fit beside the steps' own
// use, the save is synchronous on every rank, with a notice) and a thread of the part's own
// writes them while training goes on; poll() at the end of each step commits the save once
// every rank's writer is done (wait: waits for them) and finished() hands the outcomes over.
// save() first waits for a pending save; so must a load or weight write (the engine calls
// poll(true)). The destructor joins a pending writer and frees its staging.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "checkpoint/format.h"
#include "checkpoint/save_lock.h"
#include "engine/checkpoint_part.h"
#include "engine/config.h"
#include "engine/detail/checkpoint_ranges.h"
#include "engine/engine.h"
#include "engine/layout.h"
#include "engine/optimizer_state.h"
#include "engine/param_homes.h"
#include "engine/step_scalars.h"
#include "offload/ledger.h"
#include "optim/loss_scaler.h"

namespace strata::engine {

class CheckpointSave {
 public:
  struct Context {  // what a save reads and does not own
    const EngineConfig& cfg;
    const Layout& layout;
    Ranks ranks;
    DType cdt = DType::fp32;
    MemoryLedger& ledger;        // an asynchronous save's staging, charged to the host tier
    OptimizerState& state;       // masters and moments wherever they live; the sealed NVMe files
    ParamHomes& homes;           // a frozen layer's values
    const StepScalars& scalars;  // the counters and loss scaler saved beside the state
  };

  explicit CheckpointSave(const Context& ctx)
      : c_(ctx),
        part_({.cfg = ctx.cfg,
               .layout = ctx.layout,
               .ranks = ctx.ranks,
               .cdt = ctx.cdt,
               .state = ctx.state,
               .homes = ctx.homes,
               .scalars = ctx.scalars}) {}
  CheckpointSave(const CheckpointSave&) = delete;
  CheckpointSave& operator=(const CheckpointSave&) = delete;
  ~CheckpointSave() { drop_pending(); }

  SaveResult save(const std::string& root, const std::string& trainer_state, const SaveOptions& opts);
  void poll(bool wait);
  std::vector<SaveResult> finished() { return std::exchange(finished_, {}); }

 private:
  void commit_parts(const std::string& root, const std::string& part_text, int keep);
  void sum_counts_over_ranks(SaveResult& r);  // collective: bytes, linked and copied bytes
  void lock_save_root(const std::string& root);

  // checkpoint_async.cc: false (on every rank) when some rank's staging does not fit the host
  // budget: the caller saves synchronously.
  bool start_async(const std::string& root, std::int64_t step, const std::string& trainer_state,
                   const SaveOptions& opts, SaveResult& out);
  void drop_pending() noexcept;

  struct PendingSave {
    std::string root;
    int keep = 0;
    checkpoint::Manifest part;  // file 0 described when the writer is done
    std::vector<char> staging;  // the shard file's bytes, charged to the host tier
    std::uint64_t charged = 0;
    std::thread writer;
    std::atomic<bool> done{false};
    std::exception_ptr error;  // the writer's
    checkpoint::FileEntry file;
    SaveResult result;
    std::chrono::steady_clock::time_point t0;
  };

  Context c_;
  CheckpointPart part_;  // what this rank's part holds
  // The save roots this run has saved to, each locked against other runs until the engine
  // goes (checkpoint/save_lock.h); rank 0 only, which prepares and commits.
  std::vector<std::unique_ptr<checkpoint::SaveLock>> save_locks_;
  std::uint64_t host_transient_ = 0;  // host bytes the steps need above their steady use
  bool staged_before_ = false;        // once staging was charged, the host peak includes it
  std::unique_ptr<PendingSave> pending_;
  std::vector<SaveResult> finished_;
};

}  // namespace strata::engine
