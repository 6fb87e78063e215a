// The ordered op queue every communicator runs its collectives through: ops run one at a
// time on a worker thread in issue order, which is what makes every rank's sequence of
// collectives (and Gloo tags) agree. A failed op breaks the queue: later ops fail at once
// with the first error, naming it. Teardown never blocks on a peer that is gone: ops not
// yet started on a broken queue fail at once, and ops whose stream never reached them are
// aborted (their gates will never open). Private to comm.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "runtime/comm/detail/work.h"

namespace strata::comm::detail {

class OpQueue {
 public:
  OpQueue();
  ~OpQueue();  // runs queued ungated ops (fails them when broken), aborts gated ones, joins

  // `describe` names the op in errors ("rank 1/4: all_reduce #12 of 1024 x fp32 (sum)").
  std::shared_ptr<Work> submit(std::string describe, std::function<void()> op, std::shared_ptr<Gate> gate = nullptr);
  std::uint32_t next_tag() noexcept { return tag_++; }  // call in issue order only

 private:
  struct Item {
    std::string describe;
    std::function<void()> op;
    std::shared_ptr<Gate> gate;
    std::shared_ptr<OpWork> work;
  };
  void run();

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool stop_ = false;
  std::shared_ptr<Gate> waiting_;  // the gate the worker waits on, if any
  std::string broken_;             // first failure, when broken
  std::uint32_t tag_ = 1;
  std::thread worker_;
};

}  // namespace strata::comm::detail
