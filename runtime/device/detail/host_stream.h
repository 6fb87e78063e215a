// Host backend internals: the ordered worker queue behind a host Stream, the completion
// marks behind host Events, and the bandwidth-throttled link used for H2D/D2H copies.
// Private to runtime/device.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "runtime/device/device.h"

namespace strata::device::detail {

using Clock = std::chrono::steady_clock;

// One record() of an Event. The stream that recorded it completes it in order; waiters
// hold a shared_ptr, so a later re-record (a new Mark) cannot release them early.
struct Mark {
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  Clock::time_point when{};
  void complete();
  void wait();
  bool is_done();
};

class HostEvent final : public Event {
 public:
  bool query() override;
  void synchronize() override;
  double elapsed_ms(Event& later) override;
  std::shared_ptr<Mark> arm();      // record(): a fresh mark becomes current
  std::shared_ptr<Mark> current();  // wait(): the mark to wait for (nullptr: never recorded)

 private:
  std::mutex mutex_;
  std::shared_ptr<Mark> mark_;
};

// The host backend's HostSignal: the value and its waiters live in a shared state, so a
// stream task waiting on it holds the state, not the signal.
class HostSignalImpl final : public HostSignal {
 public:
  struct State {
    std::mutex mutex;
    std::condition_variable cv;
    std::uint32_t value = 0;
    void wait_for(std::uint32_t target);
  };
  void raise(std::uint32_t value) override;
  std::uint32_t value() const override;
  const std::shared_ptr<State>& state() const noexcept { return state_; }

 private:
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

// Serialises transfers in one direction at a fixed bandwidth: a copy of n bytes occupies
// the link for n / bandwidth seconds after the previous copy's slot ends, and completes at
// the end of its slot. Unthrottled when bytes_per_s <= 0.
class Link {
 public:
  explicit Link(double bytes_per_s) : bytes_per_s_(bytes_per_s) {}
  void transfer(void* dst, const void* src, std::size_t bytes);

 private:
  double bytes_per_s_;
  std::mutex mutex_;
  Clock::time_point next_free_{};
};

class HostStream final : public Stream {
 public:
  using Unregister = std::function<void(HostStream*)>;
  // guard_key >= 0: the device guards its memory with this protection key; the worker may
  // touch it, and runs each task alone (no TBB worker threads, which may not).
  HostStream(Link& h2d, Link& d2h, Unregister unregister, int guard_key = -1);
  ~HostStream() override;

  void copy_async(void* dst, const void* src, std::size_t bytes, CopyKind kind) override;
  void memset_async(void* dst, int value, std::size_t bytes) override;
  void launch_host(std::function<void()> fn) override;
  void record(Event& event) override;
  void wait(Event& event) override;
  void wait(HostSignal& signal, std::uint32_t value) override;
  bool query() override;
  void synchronize() override;
  void* native_handle() noexcept override { return nullptr; }
  Backend backend() const noexcept override { return Backend::host; }

  // `always` work (event marks, frees) still runs after a sticky error so that other
  // streams waiting on this one never hang and memory returns to its budget.
  void enqueue(std::function<void()> fn, bool always = false);

 private:
  struct Task {
    std::function<void()> fn;
    bool always;
  };
  void run();

  Link& h2d_;
  Link& d2h_;
  Unregister unregister_;
  std::mutex mutex_;
  std::condition_variable work_cv_;
  std::condition_variable idle_cv_;
  std::deque<Task> queue_;
  bool busy_ = false;
  bool stop_ = false;
  std::exception_ptr error_;
  bool error_reported_ = false;  // synchronize() has rethrown it at least once
  int guard_key_;
  std::thread worker_;
};

}  // namespace strata::device::detail
