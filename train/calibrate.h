// `strata bench calibrate` as a library call: the rates `strata plan` times a step with
// (calibration.h), measured by the benches that own each measurement, each run as a child
// `strata` process (bench_child.h) so that every figure is exactly what that bench reports:
// `bench gpt` (GEMM, fp32 and bf16 products), `bench adam` (the CPU optimizer), `bench device`
// (the host device's link), `bench io` (NVMe on the directory), `strata train` beside `bench
// gpt` (the engine's gradient path) and `bench comm` (two ranks over Gloo).
#pragma once

#include <functional>
#include <string>

#include "train/calibration.h"

namespace strata::train {

struct CalibrateOptions {
  std::string nvme;                             // a directory on the NVMe device (created when missing)
  std::string out = "strata-calibration.json";  // written when not empty
  bool quick = false;                           // smaller sizes, fewer repetitions
  std::string strata;                           // the `strata` executable to run; empty: this one
  std::string exe() const;
};

// measuring(what) is called as each measurement starts ("GEMM", "optimizer", "link", "NVMe",
// "gradient path", "collectives"). Throws naming the bench that failed and what it printed.
Calibration calibrate(const CalibrateOptions& o, const std::function<void(const char* what)>& measuring);

}  // namespace strata::train
