// IoFuture and the multi-wait functions (see future.h). One process-wide condition
// variable wakes every waiter on every request completion; completions are per request
// (not per block), so this costs little and lets wait_any watch futures of many engines.
#include "io/future.h"

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <mutex>

namespace strata::io {
namespace detail {

struct FutureState {
  std::atomic<bool> done{false};
  IoResult result;
};

namespace {
std::mutex& wake_mutex() {
  static std::mutex m;
  return m;
}
std::condition_variable& wake_cv() {
  static std::condition_variable cv;
  return cv;
}
}  // namespace

std::shared_ptr<FutureState> make_future_state() { return std::make_shared<FutureState>(); }

void complete(FutureState& state, IoResult result) {
  state.result = std::move(result);
  {
    // The store happens under the mutex so a waiter that just checked `done` cannot miss
    // the notification.
    std::lock_guard<std::mutex> lock(wake_mutex());
    state.done.store(true, std::memory_order_release);
  }
  wake_cv().notify_all();
}

}  // namespace detail

namespace {

const IoResult& invalid_result() {
  static const IoResult r{-EINVAL, 0, "wait on an invalid IoFuture (default-constructed or moved from)"};
  return r;
}

bool any_ready(std::span<const IoFuture> futures, int* index) {
  for (std::size_t i = 0; i < futures.size(); ++i) {
    if (futures[i].ready()) {
      *index = static_cast<int>(i);
      return true;
    }
  }
  return false;
}

}  // namespace

bool IoFuture::ready() const noexcept { return state_ && state_->done.load(std::memory_order_acquire); }

IoResult IoFuture::wait() const {
  if (!state_) return invalid_result();
  if (!ready()) {
    std::unique_lock<std::mutex> lock(detail::wake_mutex());
    detail::wake_cv().wait(lock, [&] { return state_->done.load(std::memory_order_acquire); });
  }
  return state_->result;
}

bool IoFuture::wait_for(std::chrono::milliseconds timeout) const {
  if (!state_) return false;
  if (ready()) return true;
  std::unique_lock<std::mutex> lock(detail::wake_mutex());
  return detail::wake_cv().wait_for(lock, timeout, [&] { return state_->done.load(std::memory_order_acquire); });
}

IoResult wait_all(std::span<const IoFuture> futures) {
  IoResult total;
  bool failed = false;
  for (const IoFuture& f : futures) {
    const IoResult r = f.wait();
    if (!r.ok() && !failed) {
      failed = true;
      total = r;
    }
    if (!failed) total.bytes += r.bytes;
  }
  return total;
}

int wait_any(std::span<const IoFuture> futures, std::chrono::milliseconds timeout) {
  if (futures.empty()) return -1;
  int index = -1;
  if (any_ready(futures, &index)) return index;
  std::unique_lock<std::mutex> lock(detail::wake_mutex());
  auto pred = [&] { return any_ready(futures, &index); };
  if (timeout.count() < 0) {
    detail::wake_cv().wait(lock, pred);
    return index;
  }
  return detail::wake_cv().wait_for(lock, timeout, pred) ? index : -1;
}

std::vector<std::size_t> poll(std::span<const IoFuture> futures) {
  std::vector<std::size_t> ready;
  for (std::size_t i = 0; i < futures.size(); ++i) {
    if (futures[i].ready()) ready.push_back(i);
  }
  return ready;
}

}  // namespace strata::io
