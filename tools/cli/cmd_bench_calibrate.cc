// `strata bench calibrate --nvme DIR [--out FILE] [--quick]`: measures the rates `strata plan`
// times a step with (calibration.h) by running the benches that own each measurement as
// children of this executable, so every figure is exactly what that bench reports: `bench
// gpt` (GEMM, fp32 and bf16 products), `bench adam` (the CPU optimizer), `bench device` (the
// host device's link), `bench io` (NVMe on DIR), `strata train` beside `bench gpt` (the
// engine's gradient path) and `bench comm` (two ranks over Gloo). Writes one JSON file and
// prints it.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/core/host_memory.h"
#include "runtime/core/stats.h"
#include "runtime/core/units.h"
#include "tools/cli/bench_child.h"
#include "tools/cli/command.h"
#include "train/calibration.h"
#include "train/output_check.h"

namespace strata::cli {

using namespace strata::train;  // the library these commands parse flags for
namespace {

struct Options {
  std::string nvme;
  std::string out = "strata-calibration.json";
  bool quick = false;
};

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
double grad_path_seconds_per_elem(const Options& o, double adam_params_per_s) {
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
    const auto pass =
        run_self_json("bench gpt" + shape + " --micro-batch 1 --products bf16 --iters 7 --json", "bench calibrate");
    run_self("train --model gpt" + shape + " --config " + shell_quote(cfg) + " --data " + shell_quote(data) +
                 " --steps 10 --device host --device-budget 256MiB --log-json " + shell_quote(log),
             "bench calibrate");
    const double params = number(pass, "parameters", "gpt");
    const double extra = median_step_ms(log) / 1e3 - 8 * number(pass, "pass_s", "gpt") - params / adam_params_per_s;
    per_elem.push_back(std::max(0.0, extra) / (8 * params));
  }
  std::filesystem::remove_all(dir);
  return median(per_elem);
}

int run(const Options& o) {
  check_output_file("--out", o.out);
  check_output_dir("--nvme", o.nvme);  // created when missing, as strata train creates nvme_path
  const int iters = o.quick ? 2 : 5;
  const std::string it = " --iters " + std::to_string(iters);
  Calibration c;
  c.host = host_name();
  c.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::printf("calibrating %s (%d threads): GEMM", c.host.c_str(), c.threads);
  std::fflush(stdout);
  // The GEMM on a GPT block's weight products at 512 rows (d_model 256 or 512).
  const std::string gpt = std::string(" --layers 1 --heads 4 --seq-len 128 --micro-batch 4 --json") + it +
                          (o.quick ? " --d-model 256" : " --d-model 512");
  c.gemm_fp32_flops =
      number(run_self_json("bench gpt --products fp32" + gpt, "bench calibrate"), "gemm_flops_per_s", "gpt");
  c.gemm_bf16_flops =
      number(run_self_json("bench gpt --products bf16" + gpt, "bench calibrate"), "gemm_flops_per_s", "gpt");
  std::printf(", optimizer");
  std::fflush(stdout);
  const std::string params = o.quick ? "4M" : "16M";
  c.adam_params_per_s = 1e9 * number(run_self_json("bench adam --optimizer adamw --grad-dtype fp32 --copy-out bf16 "
                                                   "--params " +
                                                       params + it + " --json",
                                                   "bench calibrate"),
                                     "gparams_per_s", "adam");
  std::printf(", link");
  std::fflush(stdout);
  const auto dev = run_self_json("bench device --device host --size 64MiB" + it + " --json", "bench calibrate");
  c.h2d_gbps = number(dev, "h2d_gbps", "device");
  c.d2h_gbps = number(dev, "d2h_gbps", "device");
  std::printf(", NVMe");
  std::fflush(stdout);
  const auto io = run_self_json("bench io --dir " + shell_quote(o.nvme) + " --size " + (o.quick ? "64MiB" : "256MiB") +
                                    " --block 1MiB" + it + " --json",
                                "bench calibrate");
  c.nvme_read_gbps = number(io, "read_gbps", "io");
  c.nvme_write_gbps = number(io, "write_gbps", "io");
  c.nvme_mixed_gbps = number(io, "mixed_gbps", "io");
  std::printf(", gradient path");
  std::fflush(stdout);
  c.grad_path_ns_per_elem = 1e9 * grad_path_seconds_per_elem(o, c.adam_params_per_s);
  std::printf(", collectives\n");
  const auto comm = run_self_json(std::string("bench comm -n 2 --min-size ") + (o.quick ? "1MiB" : "4MiB") +
                                      " --max-size " + (o.quick ? "1MiB" : "16MiB") + it + " --json",
                                  "bench calibrate");
  STRATA_CHECK(comm.contains("sizes") && !comm["sizes"].empty(), Errc::internal,
               "bench calibrate: `strata bench comm --json` printed no sizes");
  const auto& big = comm["sizes"].back();
  c.reduce_scatter_busbw_gbps = number(big["reduce_scatter"], "busbw_gbps", "comm");
  c.all_gather_busbw_gbps = number(big["all_gather"], "busbw_gbps", "comm");
  c.all_reduce_busbw_gbps = number(big["all_reduce"], "busbw_gbps", "comm");

  const nlohmann::json j = calibration_json(c);
  std::ofstream f(o.out, std::ios::trunc);
  f << j.dump(2) << "\n";
  f.close();
  STRATA_CHECK(f.good(), Errc::io, "--out '", o.out, "': writing the calibration failed (disk full?)");
  std::printf("  GEMM fp32 %.1f GFLOP/s, bf16 %.1f GFLOP/s\n", c.gemm_fp32_flops / 1e9, c.gemm_bf16_flops / 1e9);
  std::printf("  CPU AdamW %.3f Gparam/s\n", c.adam_params_per_s / 1e9);
  std::printf("  engine gradient path %.2f ns per element and micro-batch\n", c.grad_path_ns_per_elem);
  std::printf("  host link H2D %.2f GB/s, D2H %.2f GB/s\n", c.h2d_gbps, c.d2h_gbps);
  std::printf("  NVMe (%s) read %.2f GB/s, write %.2f GB/s, mixed %.2f GB/s\n", o.nvme.c_str(), c.nvme_read_gbps,
              c.nvme_write_gbps, c.nvme_mixed_gbps);
  std::printf("  2 ranks (Gloo) bus bandwidth: reduce-scatter %.2f GB/s, all-gather %.2f GB/s, all-reduce %.2f GB/s\n",
              c.reduce_scatter_busbw_gbps, c.all_gather_busbw_gbps, c.all_reduce_busbw_gbps);
  std::printf("wrote %s\n", o.out.c_str());
  return 0;
}

Action setup(CLI::App& cmd) {
  auto o = std::make_shared<Options>();
  cmd.add_option("--nvme", o->nvme, "Directory on the NVMe device that will hold swap files")->required();
  cmd.add_option("--out", o->out, "Calibration file to write (default strata-calibration.json)");
  cmd.add_flag("--quick", o->quick, "Smaller sizes and fewer repetitions (about a quarter of the time)");
  return [o] { return run(*o); };
}

const Registration reg("bench", "calibrate",
                       "Measure this machine's rates (GEMM, CPU optimizer, link, NVMe, collectives) for strata plan",
                       setup);

}  // namespace
}  // namespace strata::cli
