// `strata plan`'s whole search as a library call: the budgets and the base config read, every
// candidate of plan_search.h sized, the fitting ones' passes profiled (by the caller's
// profiler: a `strata bench` child process for the command, pass_profile.h in process for
// the C API's strata_plan) and timed from the calibration, fastest first, with each one's
// bytes per step and its NVMe writes a day against the drive's rated endurance. A budget
// nothing fits is refused, naming for each tier the smallest budget that would do.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "train/calibration.h"
#include "train/model.h"
#include "train/plan_search.h"

namespace strata::train {

struct PlanOptions {
  ModelOptions m;         // gpt, or a Hugging Face directory
  std::string budget;     // device=BYTES,host=BYTES[,nvme=BYTES]
  std::string nvme_path;  // lets the search use NVMe
  std::string config;     // base config (optimizer, precision, schedule); empty: a default
  std::string calibration = "strata-calibration.json";  // from strata bench calibrate
  std::string emit;                                     // the chosen config written here; empty: not
  int world = 1, local_ranks = 0;                       // local_ranks 0: world (strata launch -n N on one host)
  int batch = 0;                                        // sequences per rank per step; 0: the config's, else 8
  int iters = 5;                                        // profiled passes per micro-batch (median)
  double drive_tbw = 0;                                 // the NVMe drive's rated endurance, TB written (0: not given)
};

// What a candidate moves per step (one rank; the estimate's placement traffic) and, at its
// predicted step time, the NVMe bytes written a day by the ranks on this host (they share
// its drive), against the drive's rated endurance when given.
struct Traffic {
  std::uint64_t h2d = 0, d2h = 0, nvme_read = 0, nvme_write = 0;  // per step, one rank
  double nvme_write_per_day = 0;                                  // bytes, this host's ranks
  double endurance_days = 0;                                      // 0: no --drive-tbw or no writes
};
Traffic traffic_of(const Candidate& c, int local_ranks, double drive_tbw);

// Seconds of the model's training pass at micro-batch `micro`, re-materialization `remat`,
// products "fp32" or "bf16".
using PassProfiler = std::function<double(int micro, const std::string& remat, const std::string& products)>;

struct Plan {
  PlanRequest request;
  Calibration calibration;
  std::size_t candidates = 0;  // every candidate searched
  std::vector<Candidate> fit;  // those that fit, fastest first
  double tokens = 0;           // tokens a step, every rank together
  Traffic traffic(std::size_t k) const { return traffic_of(fit[k], request.local_ranks, drive_tbw); }
  // The best `top` candidates, as `strata plan --json` prints them.
  nlohmann::json json(int top) const;
  double drive_tbw = 0;
};

// Throws Errc::invalid_argument naming the option, Errc::out_of_budget when nothing fits.
// Writes the chosen config to o.emit when given.
Plan make_plan(const PlanOptions& o, const PassProfiler& profile);

// The model's shape as `strata bench` and `strata train` flags (" --preset 124M --layers 4 ...").
std::string model_flags(const ModelOptions& m);

}  // namespace strata::train
