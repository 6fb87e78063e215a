// `strata bench calibrate --nvme DIR [--out FILE] [--quick]`: measures the rates `strata plan`
// times a step with by running the benches that own each measurement as children of this
// executable (train/calibrate.h), writes them to one JSON file and prints them.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <thread>

#include "runtime/core/error.h"
#include "runtime/core/host_memory.h"
#include "tools/cli/command.h"
#include "train/calibrate.h"

namespace strata::cli {

using namespace strata::train;  // the library these commands parse flags for
namespace {

using Options = CalibrateOptions;

int run(const Options& o) {
  STRATA_CHECK(!o.out.empty(), Errc::invalid_argument, "--out is empty: name the calibration file to write");
  std::printf("calibrating %s (%d threads): ", host_name().c_str(),
              static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  bool first = true;
  const Calibration c = calibrate(o, [&](const char* what) {
    std::printf("%s%s", first ? "" : ", ", what);
    std::fflush(stdout);
    first = false;
  });
  std::printf("\n");
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
