// StepTail (the protocol in step_tail.h).
#include "engine/step_tail.h"

#include <algorithm>
#include <chrono>

namespace strata::engine {

void StepTail::arm(std::size_t layers) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    settled_.assign(layers, 0);
    kept_ = false;
    lane_done_ = false;
  }
  ascending_.store(false);
}

bool StepTail::kept() const {
  std::lock_guard<std::mutex> lock(mu_);
  return kept_;
}

void StepTail::layer_stepped(int li) {
  const auto i = static_cast<std::size_t>(li);
  {
    std::lock_guard<std::mutex> lock(mu_);
    settled_[i] = kept_ ? 3 : 1;
    if (!kept_) {
      cv_.notify_all();
      return;
    }
  }
  c_.update.commit(li);
  c_.grads.zero_layer(li);
  std::lock_guard<std::mutex> lock(mu_);
  settled_[i] = 2;
  cv_.notify_all();
}

void StepTail::lane_ended(bool failed, const std::function<void()>& commit) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failed && kept_) commit();  // the tail's end (swapped layers only): run() left the commit
    lane_done_ = true;
  }
  cv_.notify_all();
}

bool StepTail::keep(const std::function<void()>& commit_now) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (lane_done_) return false;
    kept_ = true;
    left_ = static_cast<int>(std::count(settled_.begin(), settled_.end(), 0));
    if (commit_now) {
      ascending_.store(true, std::memory_order_release);
      commit_now();
    }
    running_ = true;
  }
  ascending_.store(true, std::memory_order_release);
  return true;
}

bool StepTail::wait_for(int li) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto t0 = std::chrono::steady_clock::now();
  cv_.wait(lock, [&] {
    const char st = settled_[static_cast<std::size_t>(li)];
    return st == 1 || st == 2 || lane_done_;
  });
  c_.io.optimizer_wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return lane_done_;
}

void StepTail::finish() {
  std::lock_guard<std::mutex> lock(mu_);
  kept_ = false;
  lane_done_ = false;
}

void StepTail::failed(const std::exception_ptr& e) {
  // Layers the tail stepped are committed, the rest and every layer's NVMe optimizer state
  // are the last step's: nothing continues from such a state.
  std::string what = "unknown error";
  failure_code_ = Errc::internal;
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    what = err.what();
    failure_code_ = err.code();
  } catch (const std::exception& err) {
    what = err.what();
  } catch (...) {
  }
  failure_ = str_cat("rank ", c_.rank, ": the optimizer step's tail failed after step() returned (", what,
                     "): parameters and optimizer state now come from different steps; resume from a checkpoint");
  STRATA_THROW(failure_code_, failure_);
}

void StepTail::zero_grads() {
  std::vector<char> skip;
  if (running_) {
    std::lock_guard<std::mutex> lock(mu_);
    skip = settled_;
    for (char& st : skip) st = st == 1 ? 0 : 1;  // the tail zeroes every layer it had not stepped when run() kept it
  }
  c_.grads.zero(skip);
}

}  // namespace strata::engine
