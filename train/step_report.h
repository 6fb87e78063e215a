// What `strata train` prints per step (plain and pipelined). By default one line of at most
// about 120 characters: step, loss (and validation loss when measured), step time, tokens/s,
// the device's peak against its budget, host RAM's peak against its budget and the step's I/O
// rate (link and NVMe bytes over the step's time); --verbose gives every detail (memory per
// tier with current and peak, the process's RSS, the bytes moved per link), --quiet only the
// steps with a validation loss and the last. The config's steps_per_print thins the lines:
// the first step, every N-th, the last, and any with a validation loss, a skipped (overflow)
// or undone (clipped) step are printed. --log-json keeps every step whatever is printed.
#pragma once

#include <cstdint>
#include <string>

namespace strata::train {

struct StepPrinting {
  enum class Level { quiet, normal, verbose };
  Level level = Level::normal;
  std::int64_t every = 1;  // steps_per_print (0 or 1: every step)

  // Whether step s (0-based) of `steps` gets a line.
  bool prints(std::int64_t s, std::int64_t steps, bool has_val, bool unusual) const;
};

// The default line's parts.
struct StepLine {
  std::int64_t step = 0, steps = 0;  // 1-based
  double loss = 0, val = 0;          // val: NaN when not measured
  double ms = 0, tokens_per_s = 0;
  std::uint64_t device_peak = 0, device_budget = 0, host_peak = 0, host_budget = 0;
  double io_gbps = 0;     // link and NVMe bytes over the step's time
  const char* note = "";  // "skipped (overflow)", "undone (clipped)" or ""
};
std::string compact_step_line(const StepLine& l);

// "21.3/24.0 MiB": used against budget in the budget's unit; the used bytes alone without a budget.
std::string bytes_of(std::uint64_t used, std::uint64_t budget);

}  // namespace strata::train
