// The rates of this machine that `strata plan` times a step with, as `strata bench calibrate`
// measures them and writes them to a JSON file: GEMM by product dtype, the CPU optimizer,
// the engine's gradient path, the host device's link, NVMe through the io_uring engine, and
// collectives between two ranks. Every rate is a median the corresponding `strata bench` command measured.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace strata::train {

struct Calibration {
  std::string host;                   // the machine it was measured on
  int threads = 0;                    // hardware threads the benches used
  double gemm_fp32_flops = 0;         // FLOP/s, the GPT block's weight products in fp32
  double gemm_bf16_flops = 0;         // the same with bf16 products (fp32 where the CPU lacks them)
  double adam_params_per_s = 0;       // CPU AdamW: fp32 master and moments, fp32 gradient, bf16 copy
  double grad_path_ns_per_elem = 0;   // the engine's gradient path, per element and micro-batch
  double h2d_gbps = 0, d2h_gbps = 0;  // the host device's link (pinned), GB/s
  double nvme_read_gbps = 0, nvme_write_gbps = 0, nvme_mixed_gbps = 0;
  double reduce_scatter_busbw_gbps = 0;  // two local ranks over Gloo, largest message
  double all_gather_busbw_gbps = 0;
  double all_reduce_busbw_gbps = 0;
};

nlohmann::json calibration_json(const Calibration& c);
// Reads a file written by `strata bench calibrate`; a missing file, bad JSON, a missing key
// or a rate that is not positive is an error naming the file and the key, and saying to
// run `strata bench calibrate` again.
Calibration load_calibration(const std::string& path);

}  // namespace strata::train
