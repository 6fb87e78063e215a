// Progress of a long phase (loading weights, writing the first values to NVMe, export,
// verify), logged at info level on stderr: nothing for a phase that ends within its first two
// seconds, then one line every two seconds with the bytes done, the share of the total and the
// rate, and a last line when it ends ("loading weights: 5.00 GiB in 6.1 s (0.82 GB/s)").
// `quiet` (ranks other than 0) silences it. Not thread-safe: one thread advances it.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace strata {

class Progress {
 public:
  Progress(std::string phase, std::uint64_t total_bytes, bool quiet = false);
  ~Progress();  // the last line, when a line was printed
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void advance(std::uint64_t bytes);
  std::uint64_t done() const noexcept { return done_; }

 private:
  using Clock = std::chrono::steady_clock;
  std::string phase_;
  std::uint64_t total_ = 0, done_ = 0;
  bool quiet_ = false, printed_ = false;
  Clock::time_point start_, next_;
};

}  // namespace strata
