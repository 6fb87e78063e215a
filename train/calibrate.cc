// `strata bench calibrate`'s measurements (see calibrate.h).
#include "train/calibrate.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/core/host_memory.h"
#include "runtime/core/stats.h"
#include "runtime/core/units.h"
#include "train/bench_child.h"
#include "train/output_check.h"

namespace strata::train {

std::string CalibrateOptions::exe() const { return strata.empty() ? this_executable("bench calibrate") : strata; }

namespace {

double number(const nlohmann::json& j, const char* key, const char* bench) {
  STRATA_CHECK(j.contains(key) && j[key].is_number(), Errc::internal, "bench calibrate: `strata bench ", bench,
               " --json` printed no \"", key, "\"");
  return j[key].get<double>();
}

double median_step_ms(const std::string& log_path) {
  std::ifstream in(log_path);
  std::vector<double> ms;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) ms.push_back(nlohmann::json::parse(line).at("step_ms").get<double>());
  STRATA_CHECK(ms.size() > 2, Errc::internal, "bench calibrate: '", log_path, "' holds ", ms.size(), " steps");
  ms.erase(ms.begin(), ms.begin() + 2);  // the first steps record the trace and warm up
  return median(ms);
}

// The engine's gradient path (the trainer's conversion, the reduction, the fp32 accumulation)
// per element and micro-batch: the GPT trained by `strata train` at stage 0 with everything on
// the device, 8 micro-batches of one sequence per step, less 8 of its passes alone (`bench
// gpt`) and the optimizer at the rate measured above. Pass and training alternate.
double grad_path_seconds_per_elem(const CalibrateOptions& o, double adam_params_per_s) {
  const std::string dir = o.nvme + "/strata-calibrate-gpt";
  check_output_dir("--nvme", dir);
  const std::string data = dir + "/text.txt", cfg = dir + "/config.json", log = dir + "/log.jsonl";
  {
    std::ofstream t(data, std::ios::trunc);
    std::mt19937 gen(7);
    for (int i = 0; i < (1 << 16); ++i) t.put(gen() % 6 == 0 ? ' ' : static_cast<char>('a' + gen() % 26));
    std::ofstream(cfg, std::ios::trunc)
        << R"({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 8, "bf16": {"enabled": true},)"
        << R"( "optimizer": {"type": "AdamW", "params": {"lr": 0.001}}, "zero_optimization": {"stage": 0}})";
  }
  // Short sequences: the pass is small beside the gradient path, so the difference is its.
  const std::string shape = " --layers 4 --d-model 256 --heads 4 --seq-len 16 --remat never";
  std::vector<double> per_elem;
  for (int k = 0; k < (o.quick ? 1 : 3); ++k) {
    const auto pass = run_strata_json(
        o.exe(), "bench gpt" + shape + " --micro-batch 1 --products bf16 --iters 7 --json", "bench calibrate");
    run_strata(o.exe(),
               "train --model gpt" + shape + " --config " + shell_quote(cfg) + " --data " + shell_quote(data) +
                   " --steps 10 --device host --device-budget 256MiB --log-json " + shell_quote(log),
               "bench calibrate");
    const double params = number(pass, "parameters", "gpt");
    const double extra = median_step_ms(log) / 1e3 - 8 * number(pass, "pass_s", "gpt") - params / adam_params_per_s;
    per_elem.push_back(std::max(0.0, extra) / (8 * params));
  }
  std::filesystem::remove_all(dir);
  return median(per_elem);
}

}  // namespace

Calibration calibrate(const CalibrateOptions& o, const std::function<void(const char* what)>& measuring) {
  if (!o.out.empty()) check_output_file("--out", o.out);
  check_output_dir("--nvme", o.nvme);  // created when missing, as strata train creates nvme_path
  const int iters = o.quick ? 2 : 5;
  const std::string it = " --iters " + std::to_string(iters);
  Calibration c;
  c.host = host_name();
  c.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  measuring("GEMM");
  // The GEMM on a GPT block's weight products at 512 rows (d_model 256 or 512).
  const std::string gpt = std::string(" --layers 1 --heads 4 --seq-len 128 --micro-batch 4 --json") + it +
                          (o.quick ? " --d-model 256" : " --d-model 512");
  c.gemm_fp32_flops =
      number(run_strata_json(o.exe(), "bench gpt --products fp32" + gpt, "bench calibrate"), "gemm_flops_per_s", "gpt");
  c.gemm_bf16_flops =
      number(run_strata_json(o.exe(), "bench gpt --products bf16" + gpt, "bench calibrate"), "gemm_flops_per_s", "gpt");
  measuring("optimizer");
  const std::string params = o.quick ? "4M" : "16M";
  c.adam_params_per_s = 1e9 * number(run_strata_json(o.exe(),
                                                     "bench adam --optimizer adamw --grad-dtype fp32 --copy-out bf16 "
                                                     "--params " +
                                                         params + it + " --json",
                                                     "bench calibrate"),
                                     "gparams_per_s", "adam");
  measuring("link");
  const auto dev =
      run_strata_json(o.exe(), "bench device --device host --size 64MiB" + it + " --json", "bench calibrate");
  c.h2d_gbps = number(dev, "h2d_gbps", "device");
  c.d2h_gbps = number(dev, "d2h_gbps", "device");
  measuring("NVMe");
  const auto io = run_strata_json(o.exe(),
                                  "bench io --dir " + shell_quote(o.nvme) + " --size " +
                                      (o.quick ? "64MiB" : "256MiB") + " --block 1MiB" + it + " --json",
                                  "bench calibrate");
  c.nvme_read_gbps = number(io, "read_gbps", "io");
  c.nvme_write_gbps = number(io, "write_gbps", "io");
  c.nvme_mixed_gbps = number(io, "mixed_gbps", "io");
  measuring("gradient path");
  c.grad_path_ns_per_elem = 1e9 * grad_path_seconds_per_elem(o, c.adam_params_per_s);
  measuring("collectives");
  const auto comm = run_strata_json(o.exe(),
                                    std::string("bench comm -n 2 --min-size ") + (o.quick ? "1MiB" : "4MiB") +
                                        " --max-size " + (o.quick ? "1MiB" : "16MiB") + it + " --json",
                                    "bench calibrate");
  STRATA_CHECK(comm.contains("sizes") && !comm["sizes"].empty(), Errc::internal,
               "bench calibrate: `strata bench comm --json` printed no sizes");
  const auto& big = comm["sizes"].back();
  c.reduce_scatter_busbw_gbps = number(big["reduce_scatter"], "busbw_gbps", "comm");
  c.all_gather_busbw_gbps = number(big["all_gather"], "busbw_gbps", "comm");
  c.all_reduce_busbw_gbps = number(big["all_reduce"], "busbw_gbps", "comm");

  if (!o.out.empty()) {
    std::ofstream f(o.out, std::ios::trunc);
    f << calibration_json(c).dump(2) << "\n";
    f.close();
    STRATA_CHECK(f.good(), Errc::io, "--out '", o.out, "': writing the calibration failed (disk full?)");
  }
  return c;
}

}  // namespace strata::train
