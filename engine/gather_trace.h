// The recorded order of a step's stage-3 gathers, and its replay in later steps: the gather
// path's memory of what the trainer will ask for next (prefetch, retention, eviction all
// read it). Owns the trace and nothing else; knows layers only as dense indices.
//
// Protocol, per step: begin_step(); observe(layer) for every gather, in order; at step(),
// needs_record() says whether this step's order must become the trace (no trace yet, or
// the step left it, or made fewer gathers), fingerprint() lets the ranks check they agree,
// and adopt() makes it the trace. While replaying() (a trace exists and this step has
// followed it so far), cursor() is the position of the next expected gather.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace strata::engine {

class GatherTrace {
 public:
  void begin_step();
  // Records a gather. When it is the first to leave a trace being replayed, returns the
  // layer the trace expected (-1: the trace had no more gathers); replay stops for the step.
  std::optional<int> observe(int layer);

  bool replaying() const noexcept { return valid_ && !diverged_; }
  std::size_t cursor() const noexcept { return cursor_; }
  const std::vector<int>& trace() const noexcept { return trace_; }
  std::size_t recorded() const noexcept { return recording_.size(); }  // gathers so far this step
  // The first position at or after the cursor where `layer` is gathered again; trace().size()
  // + 1 when it is not.
  std::size_t next_use(int layer) const noexcept;

  bool needs_record() const noexcept { return !valid_ || diverged_ || cursor_ != trace_.size(); }
  std::uint64_t fingerprint() const noexcept;  // of this step's order
  void adopt();                                // this step's order becomes the trace

 private:
  std::vector<int> trace_;      // the recorded order
  std::vector<int> recording_;  // this step's gathers
  bool valid_ = false;
  bool diverged_ = false;
  std::size_t cursor_ = 0;
};

}  // namespace strata::engine
