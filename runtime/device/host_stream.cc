// Host backend streams and events: one worker thread per stream runs tasks in submission
// order; events are completion marks enqueued behind the work they capture.
#include "runtime/device/detail/host_stream.h"

#include <sys/mman.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "runtime/core/error.h"
#include "runtime/core/log.h"

namespace strata::device::detail {

void Mark::complete() {
  {
    std::lock_guard<std::mutex> lock(mutex);
    done = true;
    when = Clock::now();
  }
  cv.notify_all();
}

void Mark::wait() {
  std::unique_lock<std::mutex> lock(mutex);
  cv.wait(lock, [this] { return done; });
}

bool Mark::is_done() {
  std::lock_guard<std::mutex> lock(mutex);
  return done;
}

std::shared_ptr<Mark> HostEvent::arm() {
  auto mark = std::make_shared<Mark>();
  std::lock_guard<std::mutex> lock(mutex_);
  mark_ = mark;
  return mark;
}

std::shared_ptr<Mark> HostEvent::current() {
  std::lock_guard<std::mutex> lock(mutex_);
  return mark_;
}

bool HostEvent::query() {
  auto mark = current();
  return mark == nullptr || mark->is_done();
}

void HostEvent::synchronize() {
  if (auto mark = current()) mark->wait();
}

double HostEvent::elapsed_ms(Event& later) {
  auto* other = dynamic_cast<HostEvent*>(&later);
  STRATA_CHECK(other != nullptr, Errc::invalid_argument, "elapsed_ms: events of different backends");
  auto a = current(), b = other->current();
  STRATA_CHECK(a && b && a->is_done() && b->is_done(), Errc::invalid_argument,
               "elapsed_ms: both events must be recorded and complete (synchronize them first)");
  std::lock_guard<std::mutex> la(a->mutex);
  if (a == b) return 0.0;
  std::lock_guard<std::mutex> lb(b->mutex);
  return std::chrono::duration<double, std::milli>(b->when - a->when).count();
}

void HostSignalImpl::State::wait_for(std::uint32_t target) {
  std::unique_lock<std::mutex> lock(mutex);
  cv.wait(lock, [&] { return signal_reached(value, target); });
}

void HostSignalImpl::raise(std::uint32_t value) {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->value = value;
  }
  state_->cv.notify_all();
}

std::uint32_t HostSignalImpl::value() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->value;
}

void Link::transfer(void* dst, const void* src, std::size_t bytes) {
  if (bytes_per_s_ <= 0) {
    std::memcpy(dst, src, bytes);
    return;
  }
  const auto duration = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(static_cast<double>(bytes) / bytes_per_s_));
  Clock::time_point end;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto start = std::max(Clock::now(), next_free_);
    end = start + duration;
    next_free_ = end;
  }
  std::memcpy(dst, src, bytes);
  std::this_thread::sleep_until(end);
}

HostStream::HostStream(Link& h2d, Link& d2h, Unregister unregister, int guard_key)
    : h2d_(h2d), d2h_(d2h), unregister_(std::move(unregister)), guard_key_(guard_key), worker_([this] { run(); }) {}

HostStream::~HostStream() {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    idle_cv_.wait(lock, [this] { return queue_.empty() && !busy_; });
    stop_ = true;
    if (error_ && !error_reported_) {
      try {
        std::rethrow_exception(error_);
      } catch (const std::exception& e) {
        STRATA_LOG(warn, "host stream destroyed with an unreported error: ", e.what());
      }
    }
  }
  work_cv_.notify_all();
  worker_.join();
  if (unregister_) unregister_(this);
}

void HostStream::enqueue(std::function<void()> fn, bool always) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back({std::move(fn), always});
  }
  work_cv_.notify_one();
}

void HostStream::run() {
  // A guarded device's worker may touch its memory; TBB's worker threads may not, so each
  // task runs in an arena of this thread alone.
  std::optional<tbb::task_arena> alone;
  if (guard_key_ >= 0) {
    pkey_set(guard_key_, 0);
    alone.emplace(1);
  }
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    work_cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ and drained
    Task task = std::move(queue_.front());
    queue_.pop_front();
    const bool skip = error_ && !task.always;
    busy_ = true;
    lock.unlock();
    std::exception_ptr failure;
    if (!skip) {
      try {
        if (alone)
          alone->execute([&] { task.fn(); });
        else
          task.fn();
      } catch (...) {
        failure = std::current_exception();
      }
    }
    task.fn = nullptr;  // destroy captures outside the lock
    lock.lock();
    if (failure && !error_) error_ = failure;
    busy_ = false;
    if (queue_.empty()) idle_cv_.notify_all();
  }
}

void HostStream::copy_async(void* dst, const void* src, std::size_t bytes, CopyKind kind) {
  if (bytes == 0) return;
  STRATA_CHECK(dst != nullptr && src != nullptr, Errc::invalid_argument, "copy_async of ", bytes, " B with a null ",
               dst == nullptr ? "destination" : "source");
  Link* link = kind == CopyKind::host_to_device ? &h2d_ : kind == CopyKind::device_to_host ? &d2h_ : nullptr;
  enqueue([=] {
    if (link != nullptr)
      link->transfer(dst, src, bytes);
    else
      std::memmove(dst, src, bytes);
  });
}

void HostStream::memset_async(void* dst, int value, std::size_t bytes) {
  if (bytes == 0) return;
  enqueue([=] { std::memset(dst, value, bytes); });
}

void HostStream::launch_host(std::function<void()> fn) { enqueue(std::move(fn)); }

void HostStream::record(Event& event) {
  auto* host = dynamic_cast<HostEvent*>(&event);
  STRATA_CHECK(host != nullptr, Errc::invalid_argument, "record: event is not a host event");
  enqueue([mark = host->arm()] { mark->complete(); }, /*always=*/true);
}

void HostStream::wait(Event& event) {
  auto* host = dynamic_cast<HostEvent*>(&event);
  STRATA_CHECK(host != nullptr, Errc::invalid_argument, "wait: event is not a host event");
  auto mark = host->current();
  if (!mark) return;  // never recorded: nothing to wait for (as in CUDA)
  enqueue([mark] { mark->wait(); }, /*always=*/true);
}

void HostStream::wait(HostSignal& signal, std::uint32_t value) {
  auto* host = dynamic_cast<HostSignalImpl*>(&signal);
  STRATA_CHECK(host != nullptr, Errc::invalid_argument, "wait: signal is not a host signal");
  enqueue([state = host->state(), value] { state->wait_for(value); }, /*always=*/true);
}

bool HostStream::query() {
  std::lock_guard<std::mutex> lock(mutex_);
  return queue_.empty() && !busy_;
}

void HostStream::synchronize() {
  std::unique_lock<std::mutex> lock(mutex_);
  idle_cv_.wait(lock, [this] { return queue_.empty() && !busy_; });
  if (error_) {
    error_reported_ = true;
    std::rethrow_exception(error_);
  }
}

}  // namespace strata::device::detail
