// What every rank of a pipelined run (pipelined.h) reports after a step, gathered on every rank
// as doubles in StepField order, and how the printing rank shows it: the step's line (compact:
// the stage nearest its device budget; --verbose: every stage's memory, replica 0's) and its
// --log-json record. Loss is the plain trainer's mean: each replica's mean per token or sample,
// then their mean; the step's time is the slowest rank's.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "runtime/comm/communicator.h"
#include "train/step_report.h"

namespace strata::train {

// What every rank reports after a step, gathered on every rank (doubles).
enum StepField {
  loss_sum,
  val_loss,  // NaN when no validation was due (or on a stage other than the last)
  step_s,
  grad_norm,
  loss_scale,
  skipped,
  lr,
  dev_used,
  dev_peak,
  dev_budget,
  dev_total_peak,  // the whole device: the engine's ledger, the activation pool, the fp32 copies
  host_peak,
  nvme_used,
  kFields
};

// Every rank's row of `mine` (k doubles), rank-major; `comm` null: this rank alone.
std::vector<double> gather_rows(comm::Communicator* comm, std::vector<double> mine);

struct PipelinedReport {
  int P = 1, D = 1;  // stages, replicas (rank = stage * D + replica)
  std::int64_t steps = 0;
  std::uint64_t tokens_per_step = 0;  // every replica's
  StepPrinting printing;
  std::ofstream* log = nullptr;  // --log-json, or null
  std::string log_path;
  // Prints (when due) and logs step s (from 0) from every rank's row.
  void report(std::int64_t s, const std::vector<double>& rows) const;

 private:
  static double field(const std::vector<double>& rows, int q, StepField f) {
    return rows[static_cast<std::size_t>(q) * kFields + f];
  }
  void print_verbose(std::int64_t s, const std::vector<double>& rows, double loss, double val, double step,
                     double tps) const;
  void print_compact(std::int64_t s, const std::vector<double>& rows, double loss, double val, double step,
                     double tps) const;
};

}  // namespace strata::train
