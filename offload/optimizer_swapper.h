// OptimizerSwapper: one rank's optimizer state (fp32 master weights; exp_avg and exp_avg_sq
// in fp32, bf16 or q8)
// kept on NVMe in checksummed swap files and stepped in sub-groups through a pipeline of
// pinned buffers: sub-group i+1 is read while the caller's optimizer runs on i and i-1 is
// written back (the pipelined swapping of ZeRO-Infinity and DeepSpeed).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "offload/swap_footprint.h"
#include "runtime/core/dtype.h"
#include "runtime/core/moment_format.h"

namespace strata {
class Tracer;
}

namespace strata::offload {

// Protocol. create() sizes the buffers, checks them against the budget, creates the
// directory and the swap files with their blocks reserved (fallocate), so a full device fails
// here rather than mid-training. A tensor is split into sub-groups of at most sub_group_elems
// elements, each one swap file holding [master | exp_avg | exp_avg_sq] of its elements, so a
// sub-group is always one whole-file transfer that fits one buffer, and any tensor size works.
// Each sub-group's committed state is in one file; its new state is written into a spare file,
// never over the committed one (which a checkpoint may have hard-linked), and committing makes
// the spare the sub-group's file and the old one a spare. spare_sub_groups 0 gives every
// sub-group a spare (two generations: the drive holds twice the state); n > 0 keeps n spares
// per sub-group length, shared by the sub-groups of that length (the state plus n sub-groups
// of each length). write_state(t, master) once per tensor writes its master weights (exp_avg
// and exp_avg_sq start at zero, or a checkpoint's moments) and commit_written() commits them
// once every tensor was written (discard_written() drops the writes). read_state() reads a
// range of the committed state. write_state() and read_state() take and give fp32 arrays: bf16
// moments are rounded to nearest even on the way in and widened exactly on the way out, q8
// ones coded and decoded (runtime/core/moment_format.h). Not thread-safe: one caller at a
// time. Files are removed when the swapper is destroyed.
//
// A step is a pull iterator (Step, from begin_step(order)): it reads every sub-group's committed
// state, in the order's tensors (each in offset order), reads running ahead into free buffers;
// peek() names the next sub-group (its read in flight), take() waits for its read and hands it
// to the caller, put() queues its updated state for a spare file, and finish(), after the last
// put(), waits for every write: only then does the step commit (with defer_commit it is left
// pending: commit_pending() commits it, discard_pending() drops it). ascending_rest() reorders the
// tensors whose reads have not begun, lowest first (an overlapped step's tail, which the next
// forward needs lowest layer first). A step that fails (I/O error, checksum mismatch) or that the
// caller gives up (destroys it unfinished) drains its in-flight I/O and drops its writes.
// All or nothing: when every sub-group finds a spare, nothing is committed before finish()
// (commit_pending()), so a failed or dropped step leaves the last good state readable. When a
// sub-group's length has no spare free, a sub-group of that length whose write landed commits
// first, if the step may (a step without defer_commit may; a deferred one once the caller calls
// allow_commit(), its keep-or-undo decision made); room() says whether the sub-group peek() named
// can be put() without that permission. A failure after such an early commit leaves the files
// mixing two states: the swapper then refuses steps, reads and checkpoints (naming why) until
// a load (every tensor written, then commit_written()) replaces the whole state. While a step is
// open, another step, reads and write_state() are refused (the step owns the buffers), and the
// step must not outlive the swapper; while a step is pending, a step is refused and reads see
// the committed state (with the new state of the sub-groups it committed early, if any). A scan (StepOrder::read_only)
// is a step that writes nothing: Muon's first pass, which needs each matrix's momentum whole before the step proper.
// step(fn) is the whole loop with fn on each sub-group.
struct SwapperOptions {
  std::string dir;                                 // created if missing (one per rank)
  std::uint64_t sub_group_elems = 1000000000;      // zero_optimization.sub_group_size
  int buffer_count = 4;                            // offload_optimizer.buffer_count
  std::uint64_t budget_bytes = ~std::uint64_t{0};  // host/pinned bytes the buffers may take
  bool lock_memory = true;                         // mlock the buffers (pinned)
  unsigned queue_depth = 32;                       // aio.queue_depth
  unsigned submit_batch = 8;                       // pieces per io_uring_submit (aio.single_submit: 1)
  std::uint32_t block_bytes = 1u << 20;            // aio.block_size: I/O piece and checksum block
  Tracer* tracer = nullptr;                        // optional: "nvme read", "nvme write", "optimizer" rows
  // exp_avg and exp_avg_sq in the files: fp32, bf16 or q8 (q8: sub-groups are whole blocks of 16
  // elements, sub_group_elems rounded down to one, and tensors are multiples of 16 elements).
  MomentFormat moment_format = MomentFormat::fp32;
  // offload_optimizer.spare_sub_groups: spare files per sub-group length (0: one per sub-group,
  // two generations of the state on the drive).
  std::uint64_t spare_sub_groups = 0;
};

struct SwapTensor {
  std::string name;         // for messages ("layer 3")
  std::uint64_t elems = 0;  // elements of this rank's shard
};

// One sub-group handed to the caller's optimizer: pointers into a swap buffer.
struct SubGroup {
  std::size_t tensor = 0;
  std::uint64_t offset = 0;  // first element within the tensor
  std::uint64_t elems = 0;
  float* master = nullptr;
  void* exp_avg = nullptr;  // SwapperOptions::moment_format
  void* exp_avg_sq = nullptr;
};

struct SwapperStats {
  std::uint64_t bytes_read = 0, bytes_written = 0;  // payload, last step
  double step_seconds = 0;                          // last step, wall
  double compute_seconds = 0;                       // last step, inside fn
  double wait_seconds = 0;                          // last step, waiting on I/O
};

class OptimizerSwapper {
 public:
  // Throws strata::Error: budget below one buffer (naming the minimum), directory or file
  // not creatable or writable, not enough space.
  OptimizerSwapper(const SwapperOptions& options, std::vector<SwapTensor> tensors);
  ~OptimizerSwapper();
  OptimizerSwapper(const OptimizerSwapper&) = delete;
  OptimizerSwapper& operator=(const OptimizerSwapper&) = delete;

  // Writes tensor t's whole state into spare files (exp_avg, exp_avg_sq: null for zeros);
  // commit_written() commits it once every tensor was written.
  void write_state(std::size_t tensor, const float* master, const float* exp_avg = nullptr,
                   const float* exp_avg_sq = nullptr);
  void commit_written();
  void discard_written() noexcept;
  bool has_written() const noexcept;  // a write_state() waits for commit_written()
  struct StepOrder {
    std::vector<std::size_t> tensors;  // every tensor once (a scan: any of them once); empty: tensor order
    bool defer_commit = false;         // the step's writes wait for commit_pending()
    // A scan: the sub-groups are read (checksums verified) and handed out as a step's are, but
    // put() only frees the buffer and finish() commits nothing; the caller may change
    // the buffer, which is never written. Every buffer may read ahead.
    bool read_only = false;
    // A scan that reads only the checksum blocks holding exp_avg: the SubGroup's exp_avg is
    // the state, its master and exp_avg_sq undefined (what the blocks around exp_avg hold).
    bool first_moment_only = false;
  };
  class Step {
   public:
    struct Upcoming {
      std::size_t tensor = 0;
      bool first = false, last = false;  // the tensor's first / last sub-group
    };
    Step(Step&&) noexcept;
    Step& operator=(Step&&) = delete;
    ~Step();                         // unfinished: drains its I/O, drops its writes
    void ascending_rest();           // the tensors not yet begun, lowest first from now on
    std::optional<Upcoming> peek();  // the next sub-group (its read issued); empty after the last
    bool room() const;               // after peek(): its put() needs no early commit, or may make one
    void allow_commit();             // a deferred step: sub-groups may commit early from now on
    SubGroup take();                 // waits for its read; the caller's until put()
    void put();                      // the taken sub-group's new state goes to a spare file
    void finish();                   // after the last put(): every write on disk, the step committed

   private:
    friend class OptimizerSwapper;
    struct State;
    explicit Step(std::unique_ptr<State> s);
    std::unique_ptr<State> s_;
  };
  Step begin_step();  // tensor order, committed at finish()
  Step begin_step(const StepOrder& order);
  void step(const std::function<void(const SubGroup&)>& fn);
  void step(const std::function<void(const SubGroup&)>& fn, const StepOrder& order);
  bool pending() const noexcept;
  void commit_pending();
  void discard_pending() noexcept;
  // Reads elements [offset, offset + elems) of tensor t's committed state
  // (checksums verified); a null output is not read into.
  void read_state(std::size_t tensor, std::uint64_t offset, std::uint64_t elems, float* master,
                  float* exp_avg = nullptr, float* exp_avg_sq = nullptr);
  // Reads tensor t's committed master weights a sub-group at a time (checksums
  // verified) and hands each to fn(first element, master, elements) in a swap buffer: no copy.
  void visit_masters(std::size_t tensor,
                     const std::function<void(std::uint64_t offset, const float* master, std::uint64_t elems)>& fn);

  std::uint64_t buffer_bytes() const noexcept;  // per buffer
  int buffer_count() const noexcept;            // buffers actually allocated
  std::uint64_t buffer_elems() const noexcept;  // elements per sub-group at most
  std::size_t sub_groups() const noexcept;
  std::size_t tensors() const noexcept;
  std::uint64_t state_bytes() const noexcept;  // payload of the state, once
  std::uint64_t file_bytes() const noexcept;   // every file on disk, spares and headers included
  const std::string& dir() const noexcept;
  // The committed swap file of the sub-group holding `elem` of `tensor`.
  std::string file_of(std::size_t tensor, std::uint64_t elem) const;
  // The committed swap files of `tensor`, one per sub-group, in element order (refused while
  // the files mix two states). Between steps they are sealed: a checkpoint may hard-link them.
  // A step never writes into a file that has another link: it replaces such a file (same path,
  // new inode) first, so the linked copy keeps the state it had.
  struct SealedFile {
    std::string path;
    std::uint64_t offset = 0, elems = 0;  // the tensor's elements it holds
  };
  std::vector<SealedFile> sealed_files(std::size_t tensor) const;
  // Every swap file, committed or spare (what a checkpoint may have linked).
  std::vector<std::string> all_files() const;
  SwapperStats stats() const noexcept;

  // The smallest budget that fits one buffer for these tensors and options.
  static std::uint64_t min_budget_bytes(const SwapperOptions& options, const std::vector<SwapTensor>& tensors);
  // What a store for these tensors takes, computed without creating it: the buffers the
  // constructor allocates and every swap file on disk (spares and headers included).
  // Refuses, as the constructor does, a buffer count below 1 or a budget below one buffer.
  using Footprint = SwapFootprint;
  static Footprint footprint(const SwapperOptions& options, const std::vector<SwapTensor>& tensors);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::offload
