// OptimizerLane (the protocol in optimizer_lane.h).
#include "engine/optimizer_lane.h"

#include "runtime/core/error.h"

namespace strata::engine {

void OptimizerLane::start(std::size_t layers, std::function<void()> work) {
  STRATA_CHECK(!active(), Errc::internal, "optimizer lane: start() while a step still runs on it");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ready_.assign(layers, 0);
    done_.clear();
    done_.resize(layers);
    cancelled_ = false;
    plan_open_ = false;
    decision_ = -1;
    error_ = nullptr;
  }
  thread_ = std::thread([this, work = std::move(work)] {
    try {
      work();
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      error_ = std::current_exception();
    }
  });
}

void OptimizerLane::ready(int li, std::unique_ptr<device::Event> done) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!active() || li < 0 || static_cast<std::size_t>(li) >= ready_.size()) return;
    done_[static_cast<std::size_t>(li)] = std::move(done);
    ready_[static_cast<std::size_t>(li)] = 1;
  }
  cv_.notify_all();
}

void OptimizerLane::wait_ready(int li) {
  device::Event* done = nullptr;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    const auto i = static_cast<std::size_t>(li);
    cv_.wait(lock, [&] { return cancelled_ || ready_.at(i) != 0; });
    STRATA_CHECK(!cancelled_, Errc::internal, "overlapped optimizer step cancelled: the step was abandoned");
    done = done_[i].get();
  }
  if (done != nullptr) done->synchronize();  // the layer's last reduction is in its accumulator
}

void OptimizerLane::open_plan() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    plan_open_ = true;
  }
  cv_.notify_all();
}

void OptimizerLane::wait_plan() {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] { return cancelled_ || plan_open_; });
  STRATA_CHECK(!cancelled_, Errc::internal, "overlapped optimizer step cancelled: the step was abandoned");
}

void OptimizerLane::decide(bool keep) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    decision_ = keep ? 1 : 0;
  }
  cv_.notify_all();
}

bool OptimizerLane::wait_decision() {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] { return cancelled_ || decision_ >= 0; });
  STRATA_CHECK(!cancelled_, Errc::internal, "overlapped optimizer step cancelled: the step was abandoned");
  return decision_ == 1;
}

bool OptimizerLane::kept() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return decision_ == 1;
}

void OptimizerLane::join() {
  if (!active()) return;
  thread_.join();
  std::exception_ptr err;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    err = error_;
    error_ = nullptr;
    done_.clear();
  }
  if (err) std::rethrow_exception(err);
}

void OptimizerLane::cancel() noexcept {
  if (!active()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    cancelled_ = true;
  }
  cv_.notify_all();
  thread_.join();
  std::lock_guard<std::mutex> lock(mutex_);
  error_ = nullptr;
  done_.clear();
}

}  // namespace strata::engine
