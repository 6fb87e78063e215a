// Progress lines for long phases (progress.h).
#include "runtime/core/progress.h"

#include <cstdio>

#include "runtime/core/log.h"
#include "runtime/core/units.h"

namespace strata {
namespace {
constexpr auto kEvery = std::chrono::seconds(2);

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}
}  // namespace

Progress::Progress(std::string phase, std::uint64_t total_bytes, bool quiet)
    : phase_(std::move(phase)), total_(total_bytes), quiet_(quiet), start_(Clock::now()), next_(start_ + kEvery) {}

Progress::~Progress() {
  if (!printed_) return;
  const double s = seconds_since(start_);
  char text[64];
  std::snprintf(text, sizeof text, " in %.1f s (%.2f GB/s)", s, s > 0 ? static_cast<double>(done_) / s / 1e9 : 0.0);
  STRATA_LOG(info, phase_, ": ", format_bytes(done_), text);
}

void Progress::advance(std::uint64_t bytes) {
  done_ += bytes;
  if (quiet_ || Clock::now() < next_) return;
  next_ = Clock::now() + kEvery;
  printed_ = true;
  const double s = seconds_since(start_);
  char text[96];
  std::snprintf(text, sizeof text, " (%.0f%%), %.1f s, %.2f GB/s",
                total_ ? 100.0 * static_cast<double>(done_) / static_cast<double>(total_) : 0.0, s,
                s > 0 ? static_cast<double>(done_) / s / 1e9 : 0.0);
  STRATA_LOG(info, phase_, ": ", format_bytes(done_), " of ", format_bytes(total_), text);
}

}  // namespace strata
