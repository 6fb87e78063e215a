// Completion state shared between an op queued on a communicator's worker and the Work
// handed to the caller; and the gate a stream-ordered op waits behind. Private to comm.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>

#include "runtime/comm/communicator.h"

namespace strata::comm::detail {

class OpWork final : public Work {
 public:
  void finish(std::exception_ptr error) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
      error_ = std::move(error);
    }
    cv_.notify_all();
  }
  void wait() override {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [this] { return done_; });
    if (error_) std::rethrow_exception(error_);
  }
  bool test() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return done_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

// Opened by a stream task when the stream reaches a stream-ordered op; aborted when the
// communicator goes away first (its stream failed or was torn down and will never get there).
class Gate {
 public:
  void open() { release(false); }
  void abort() { release(true); }
  // Returns false when aborted.
  bool wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [this] { return open_; });
    return !aborted_;
  }

 private:
  void release(bool aborted) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (open_) return;
      open_ = true;
      aborted_ = aborted;
    }
    cv_.notify_all();
  }
  std::mutex mutex_;
  std::condition_variable cv_;
  bool open_ = false;
  bool aborted_ = false;
};

// Set while a stream-ordered form issues its op: the op is queued in issue order (so every
// rank's sequence agrees) but starts only when the stream opens the gate.
inline thread_local std::shared_ptr<Gate> t_issue_gate;

class GateScope {
 public:
  explicit GateScope(std::shared_ptr<Gate> gate) { t_issue_gate = std::move(gate); }
  ~GateScope() { t_issue_gate.reset(); }
  GateScope(const GateScope&) = delete;
  GateScope& operator=(const GateScope&) = delete;
};

}  // namespace strata::comm::detail
