#include "engine/gather_trace.h"

#include "runtime/core/random.h"

namespace strata::engine {

void GatherTrace::begin_step() {
  cursor_ = 0;
  diverged_ = false;
  recording_.clear();
}

std::optional<int> GatherTrace::observe(int layer) {
  std::optional<int> left;
  if (replaying()) {
    if (cursor_ < trace_.size() && trace_[cursor_] == layer) {
      ++cursor_;
    } else {
      diverged_ = true;
      left = cursor_ < trace_.size() ? trace_[cursor_] : -1;
    }
  }
  recording_.push_back(layer);
  return left;
}

std::size_t GatherTrace::next_use(int layer) const noexcept {
  for (std::size_t k = cursor_; k < trace_.size(); ++k) {
    if (trace_[k] == layer) return k;
  }
  return trace_.size() + 1;
}

std::uint64_t GatherTrace::fingerprint() const noexcept {
  std::uint64_t h = kFnvOffset ^ recording_.size();
  for (int x : recording_) h = (h ^ static_cast<std::uint64_t>(x + 1)) * 1099511628211ull;
  return h;
}

void GatherTrace::adopt() {
  trace_ = recording_;
  valid_ = true;
}

}  // namespace strata::engine
