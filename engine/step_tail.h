// StepTail: the overlapped step's tail (overlapped_step.h, "The tail"): which layers the
// optimizer lane has stepped, whether run() kept its work, and the hand-over between the lane's
// thread and the trainer's.
//
// Protocol. arm() before a lane starts (nothing stepped, nothing kept). On the lane:
// layer_stepped(li) after a layer's last sub-group: before keep() the layer is run()'s to
// commit and zero; after it the tail commits the layer's parameter shards behind their write and
// zeroes its accumulator itself; lane_ended() as the lane returns or throws, committing the
// swapper's step (the caller's `commit`) when the step was kept and nothing failed.
// kept() says whether run() kept the step (the lane's bets are off from then on). On the
// trainer's thread: keep() turns the lane still at work into the tail (false when it has ended
// already); wait_for(li) blocks until the tail has stepped layer li or the lane has ended
// (true: the caller joins it and calls finish()); finish() clears the hand-over once the lane is
// joined; failed() records a tail that threw (every later lane is refused with its message,
// check()); zero_grads() zeroes the accumulators but those a running tail zeroes itself.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "engine/grad_reducer.h"
#include "engine/shard_update.h"
#include "runtime/core/error.h"

namespace strata::engine {

class StepTail {
 public:
  struct Context {  // what the tail updates and does not own
    int rank = 0;
    ShardUpdate& update;  // a tail layer's parameter shards committed behind their write
    GradReducer& grads;   // and its accumulator zeroed
    IoStats& io;          // the trainer's waits for the tail
  };

  explicit StepTail(const Context& ctx) : c_(ctx) {}
  StepTail(const StepTail&) = delete;
  StepTail& operator=(const StepTail&) = delete;

  void arm(std::size_t layers);
  bool kept() const;
  void layer_stepped(int li);
  void lane_ended(bool failed, const std::function<void()>& commit);
  // commit_now: the writes of what the lane stepped so far commit at once (under the lock,
  // before the layers left go to the tail).
  bool keep(const std::function<void()>& commit_now);
  bool wait_for(int li);
  void finish();
  [[noreturn]] void failed(const std::exception_ptr& e);
  void check() const { STRATA_CHECK(failure_.empty(), failure_code_, failure_); }
  void zero_grads();

  bool running() const noexcept { return running_; }      // a tail runs (the trainer's view)
  int layers_left() const noexcept { return left_; }      // layers left to it when keep() kept the step
  std::atomic<bool>* ascending() { return &ascending_; }  // the lane polls it: ascending_rest()
  // The trainer's view ends (finish_tail(): the lane is joined next); false when none ran.
  bool stop() noexcept { return std::exchange(running_, false); }

 private:
  Context c_;
  // Under mu_, shared with the lane: settled_ (per layer: 0 not reached, 1 stepped before
  // keep() (run()'s commit and zero_grads() cover it), 3 the tail is committing and zeroing it,
  // 2 done), kept_ (run() kept the lane's work while it ran), lane_done_ (its work returned or
  // threw).
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<char> settled_;
  bool kept_ = false;
  bool lane_done_ = false;
  std::atomic<bool> ascending_{false};
  bool running_ = false;
  int left_ = 0;
  std::string failure_;  // set when a tail failed: no lane starts again
  Errc failure_code_ = Errc::internal;
};

}  // namespace strata::engine
