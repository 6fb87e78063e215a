// OptimizerLane: the thread an overlapped step's optimizer runs on (docs/design.md, "The
// overlapped step"), and the hand-over of each layer's finished gradient from the trainer's
// thread to it.
//
// Protocol. start(layers, work) runs work() on the lane's own thread. Before work touches
// layer li's gradient it calls wait_ready(li), which blocks until the trainer's thread has
// called ready(li, done) (done: an event recorded after the layer's last reduction of the
// step, waited for here; null when that reduction already completed) and throws once
// cancel() was called. A lane whose update waits for the step's plan (a deferred step) calls
// wait_plan() before its first update: it blocks until the trainer's thread calls
// open_plan(), after publishing the plan's arguments (open_plan() orders those writes before
// the lane's reads), and throws once cancel() was called. join() waits for work to return and
// rethrows what it threw. cancel()
// makes every wait throw, joins and drops the error; the destructor cancels. One step at a
// time: start() again only after join() or cancel(). A lane that must know whether its work is
// kept before it goes on (the swapper's spares are all lent: optimizer_swapper.h) calls
// wait_decision(): it blocks until the trainer's thread calls decide(keep) and returns keep,
// and throws once cancel() was called.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/device/device.h"

namespace strata::engine {

class OptimizerLane {
 public:
  OptimizerLane() = default;
  ~OptimizerLane() { cancel(); }
  OptimizerLane(const OptimizerLane&) = delete;
  OptimizerLane& operator=(const OptimizerLane&) = delete;

  void start(std::size_t layers, std::function<void()> work);
  bool active() const noexcept { return thread_.joinable(); }
  void ready(int li, std::unique_ptr<device::Event> done);
  void wait_ready(int li);  // on the lane's thread
  void open_plan();
  void wait_plan();  // on the lane's thread
  void decide(bool keep);
  bool wait_decision();  // on the lane's thread
  bool kept() const;     // decide(true) was called
  void join();
  void cancel() noexcept;

 private:
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<char> ready_;
  std::vector<std::unique_ptr<device::Event>> done_;
  bool cancelled_ = false;
  bool plan_open_ = false;
  int decision_ = -1;  // -1 undecided, 0 undone, 1 kept
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace strata::engine
