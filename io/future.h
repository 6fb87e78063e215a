// Completions of engine requests: IoResult, the IoFuture a caller waits on, the Callback
// form, and waiting on many at once (wait_all, wait_any, poll).
//
// Protocol: Engine::read/write returns an IoFuture (or takes a Callback). The io thread
// completes the request once: it stores the IoResult, then marks the future ready and wakes
// waiters. Futures may be waited on from any thread, any number of times; the result stays
// readable while a copy of the future is alive. A Callback runs on the engine's io thread:
// it must be short, must not throw and must not wait for other requests of the same engine
// (it may submit new ones).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "io/status.h"

namespace strata::io {

struct IoResult {
  int err = 0;              // 0 or -errno: the request's failure at the lowest offset
  std::uint64_t bytes = 0;  // bytes transferred (all of the region when err == 0)
  std::string message;      // names the operation, path, offset, length and errno text
  bool ok() const noexcept { return err == 0; }
  Status status() const { return ok() ? Status() : Status(err, message); }
};

using Callback = std::function<void(const IoResult&)>;

namespace detail {
struct FutureState;
std::shared_ptr<FutureState> make_future_state();
void complete(FutureState& state, IoResult result);
}  // namespace detail

class IoFuture {
 public:
  IoFuture() = default;
  explicit IoFuture(std::shared_ptr<detail::FutureState> state) : state_(std::move(state)) {}
  bool valid() const noexcept { return state_ != nullptr; }
  bool ready() const noexcept;  // never blocks; an invalid future is not ready
  // Blocks until the request completes; an invalid future returns -EINVAL at once.
  // Returns a copy, so `engine.read(...).wait()` on a temporary future is safe.
  IoResult wait() const;
  // False on timeout.
  bool wait_for(std::chrono::milliseconds timeout) const;

 private:
  std::shared_ptr<detail::FutureState> state_;
};

// Blocks until every future completes. Returns the first failed result (in span order), or
// an ok result whose bytes is the total.
IoResult wait_all(std::span<const IoFuture> futures);
// Blocks until one of the futures is ready or the timeout passes (negative: no timeout).
// Returns the index of a ready future, or -1 on timeout or an empty span.
int wait_any(std::span<const IoFuture> futures, std::chrono::milliseconds timeout = std::chrono::milliseconds(-1));
// Never blocks: the indices of the futures that are ready.
std::vector<std::size_t> poll(std::span<const IoFuture> futures);

}  // namespace strata::io
