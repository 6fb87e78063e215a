// OpQueue (see detail/op_queue.h).
#include "runtime/comm/detail/op_queue.h"

#include "runtime/core/error.h"

namespace strata::comm::detail {

OpQueue::OpQueue() : worker_([this] { run(); }) {}

OpQueue::~OpQueue() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    for (auto& item : queue_)
      if (item.gate) item.gate->abort();
    if (waiting_) waiting_->abort();
  }
  cv_.notify_all();
  worker_.join();
}

std::shared_ptr<Work> OpQueue::submit(std::string describe, std::function<void()> op, std::shared_ptr<Gate> gate) {
  auto work = std::make_shared<OpWork>();
  if (!gate) gate = t_issue_gate;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back({std::move(describe), std::move(op), std::move(gate), work});
  }
  cv_.notify_one();
  return work;
}

void OpQueue::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;
    Item item = std::move(queue_.front());
    queue_.pop_front();
    const std::string broken = broken_;
    waiting_ = item.gate;
    lock.unlock();
    std::exception_ptr error;
    const bool reached = !item.gate || item.gate->wait();
    if (!reached) {
      error = std::make_exception_ptr(
          Error(Errc::comm, item.describe + ": not run, the communicator was destroyed before its stream reached it"));
    } else if (!broken.empty()) {
      error = std::make_exception_ptr(
          Error(Errc::comm, item.describe + ": not run, the communicator is broken by an earlier failure: " + broken));
    } else {
      try {
        item.op();
      } catch (const Error& e) {
        error = std::make_exception_ptr(Error(e.code(), item.describe + ": " + e.what(), e.where()));
      } catch (const std::exception& e) {
        error = std::make_exception_ptr(Error(Errc::comm, item.describe + ": " + e.what()));
      }
    }
    if (error && broken.empty() && reached) {
      try {
        std::rethrow_exception(error);
      } catch (const std::exception& e) {
        lock.lock();
        broken_ = e.what();
        lock.unlock();
      }
    }
    item.work->finish(error);
    item.op = nullptr;
    lock.lock();
    waiting_.reset();
  }
}

}  // namespace strata::comm::detail
