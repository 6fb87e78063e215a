// The pipelined run's step report (see pipelined_report.h).
#include "train/pipelined_report.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "runtime/core/error.h"
#include "runtime/core/units.h"

namespace strata::train {

std::vector<double> gather_rows(comm::Communicator* comm, std::vector<double> mine) {
  if (comm == nullptr) return mine;
  std::vector<double> all(mine.size() * static_cast<std::size_t>(comm->world_size()));
  comm->all_gather(mine.data(), all.data(), 2 * mine.size(), DType::fp32);  // doubles as fp32 word pairs
  return all;
}

// --verbose: every stage's memory (replica 0's) on the step's line.
void PipelinedReport::print_verbose(std::int64_t s, const std::vector<double>& rows, double loss, double val,
                                    double step, double tps) const {
  const auto at = [&](int q, StepField f) { return field(rows, q, f); };
  std::string mem;
  for (int st = 0; st < P; ++st) {
    const int q = st * D;  // replica 0's stage st
    mem += str_cat("  stage ", st, ": device ", format_bytes(static_cast<std::uint64_t>(at(q, dev_used))), " (peak ",
                   format_bytes(static_cast<std::uint64_t>(at(q, dev_peak))), " / ",
                   format_bytes(static_cast<std::uint64_t>(at(q, dev_budget))), "; device total peak ",
                   format_bytes(static_cast<std::uint64_t>(at(q, dev_total_peak))), ") host peak ",
                   format_bytes(static_cast<std::uint64_t>(at(q, host_peak))));
    if (at(q, nvme_used) > 0) mem += str_cat(" nvme ", format_bytes(static_cast<std::uint64_t>(at(q, nvme_used))));
  }
  char val_text[32] = "";
  if (!std::isnan(val)) std::snprintf(val_text, sizeof val_text, "  val %.4f", val);
  std::printf("step %4lld/%lld  loss %.6f%s  %7.1f ms  %.0f tok/s  grad-norm %.4g%s%s\n", static_cast<long long>(s + 1),
              static_cast<long long>(steps), loss, val_text, step * 1e3, tps, at(0, grad_norm),
              at(0, skipped) != 0 ? "  SKIPPED (overflow)" : "", mem.c_str());
}

// The default line (step_report.h): the stage nearest its device budget, the largest host peak.
void PipelinedReport::print_compact(std::int64_t s, const std::vector<double>& rows, double loss, double val,
                                    double step, double tps) const {
  const auto at = [&](int q, StepField f) { return field(rows, q, f); };
  const auto share = [&](int st) { return at(st * D, dev_total_peak) / std::max(1.0, at(st * D, dev_budget)); };
  int tight = 0;
  double host = 0;
  for (int st = 0; st < P; ++st) {
    if (share(st) > share(tight)) tight = st;
    host = std::max(host, at(st * D, host_peak));
  }
  const StepLine line{.step = s + 1,
                      .steps = steps,
                      .loss = loss,
                      .val = val,
                      .ms = step * 1e3,
                      .tokens_per_s = tps,
                      .device_peak = static_cast<std::uint64_t>(at(tight * D, dev_total_peak)),
                      .device_budget = static_cast<std::uint64_t>(at(tight * D, dev_budget)),
                      .host_peak = static_cast<std::uint64_t>(host),
                      .note = at(0, skipped) != 0 ? "skipped (overflow)" : ""};
  std::printf("%s  (stage %d)\n", compact_step_line(line).c_str(), tight);
}

void PipelinedReport::report(std::int64_t s, const std::vector<double>& rows) const {
  const auto at = [&](int q, StepField f) { return field(rows, q, f); };
  // The plain trainer's mean: each replica's mean loss (per token or sample), then their mean.
  double loss = 0, step = 0;
  const int ranks = static_cast<int>(rows.size() / kFields);
  for (int q = 0; q < ranks; ++q) {
    loss += at(q, loss_sum) / static_cast<double>(tokens_per_step / static_cast<std::uint64_t>(D));
    step = std::max(step, at(q, step_s));
  }
  loss /= D;
  const double val = at((P - 1) * D, val_loss);  // replica 0's last stage (every replica's is the same)
  const double tps = static_cast<double>(tokens_per_step) / step;
  // Every stage sees the norm over all of them, so one rank's step outcome is every rank's.
  if (printing.prints(s, steps, !std::isnan(val), at(0, skipped) != 0)) {
    if (printing.level == StepPrinting::Level::verbose) {
      print_verbose(s, rows, loss, val, step, tps);
    } else {
      print_compact(s, rows, loss, val, step, tps);
    }
    std::fflush(stdout);
  }
  if (log == nullptr) return;
  nlohmann::json stages = nlohmann::json::array();
  for (int st = 0; st < P; ++st) {
    const int q = st * D;
    stages.push_back({{"device_used_bytes", at(q, dev_used)},
                      {"device_peak_bytes", at(q, dev_peak)},
                      {"device_budget_bytes", at(q, dev_budget)},
                      {"device_memory_peak_bytes", at(q, dev_total_peak)},
                      {"host_peak_bytes", at(q, host_peak)},
                      {"nvme_bytes", at(q, nvme_used)}});
  }
  nlohmann::json j{{"step", s + 1},
                   {"loss", loss},
                   {"step_ms", step * 1e3},
                   {"tokens_per_s", tps},
                   {"grad_norm", at(0, grad_norm)},
                   {"loss_scale", at(0, loss_scale)},
                   {"lr", at(0, lr)},
                   {"skipped", at(0, skipped) != 0},
                   {"stages", stages}};
  if (!std::isnan(val)) j["val_loss"] = val;
  *log << j.dump() << "\n";
  log->flush();
  STRATA_CHECK(log->good(), Errc::io, "--log-json '", log_path, "': writing step ", s + 1,
               " failed (disk full or removed?): ", errno_text(errno));
}

}  // namespace strata::train
