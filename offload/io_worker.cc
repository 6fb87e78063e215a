#include "offload/io_worker.h"

#include "runtime/core/log.h"

namespace strata::offload {

IoWorker::IoWorker(device::Device& dev) : signal_(dev.create_host_signal()), thread_([this] { run(); }) {}

IoWorker::~IoWorker() {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    stop_ = true;
  }
  work_cv_.notify_all();
  thread_.join();
  if (error_ && !reported_) {
    try {
      std::rethrow_exception(error_);
    } catch (const std::exception& e) {
      STRATA_LOG(warn, "NVMe I/O worker stopped with an unreported error: ", e.what());
    }
  }
}

IoWorker::Ticket IoWorker::submit(std::function<void()> fn, std::function<void()> finally) {
  Ticket t;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back({std::move(fn), std::move(finally)});
    t = ++submitted_;
  }
  work_cv_.notify_one();
  return t;
}

void IoWorker::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    work_cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and everything queued is done
    Request r = std::move(queue_.front());
    queue_.pop_front();
    const bool skip = error_ != nullptr;
    lock.unlock();
    std::exception_ptr failure;
    if (!skip) {
      try {
        r.fn();
      } catch (...) {
        failure = std::current_exception();
      }
    }
    if (r.finally) {
      try {
        r.finally();
      } catch (...) {
        if (!failure && !skip) failure = std::current_exception();
      }
    }
    r = {};  // captures go outside the lock
    lock.lock();
    const Ticket t = ++completed_;
    if (failure && !error_) {
      error_ = failure;
      failed_at_ = t;
    }
    // Raised under the lock so that the signal's value only grows.
    signal_->raise(t);
    done_cv_.notify_all();
  }
}

void IoWorker::wait_on(device::Stream& stream, Ticket t) { stream.wait(*signal_, t); }

void IoWorker::wait(Ticket t) {
  std::unique_lock<std::mutex> lock(mutex_);
  done_cv_.wait(lock, [&] { return device::signal_reached(completed_, t); });
}

bool IoWorker::succeeded(Ticket t) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !error_ || !device::signal_reached(t, failed_at_);
}

void IoWorker::synchronize() {
  std::unique_lock<std::mutex> lock(mutex_);
  done_cv_.wait(lock, [&] { return completed_ == submitted_; });
  if (error_) {
    reported_ = true;
    std::rethrow_exception(error_);
  }
}

bool IoWorker::idle() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_ == submitted_;
}

IoWorker::Ticket IoWorker::last() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return submitted_;
}

}  // namespace strata::offload
