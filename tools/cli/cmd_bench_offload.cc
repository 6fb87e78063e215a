// `strata bench offload`: the NVMe optimizer swapper against the drive. In one run, on the
// same directory, alternates `strata bench io`'s mixed read+write measurement (run as a
// child process, so it is exactly that command's code) with a swapper step of --params
// fp32 AdamW parameters (master, exp_avg, exp_avg_sq on NVMe, sub-groups of --sub-group
// elements, CPU AdamW on each); reports the swapper's NVMe GB/s (bytes read + written over
// the step's wall time), mixed_gbps and their ratio, each the median over --iters pairs.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "io/aligned.h"
#include "offload/optimizer_swapper.h"
#include "optim/adam.h"
#include "runtime/core/error.h"
#include "runtime/core/stats.h"
#include "runtime/core/units.h"
#include "tools/cli/command.h"
#include "tools/cli/io_boundary.h"
#include "train/bench_child.h"
#include "train/interrupt.h"

namespace strata::cli {

using namespace strata::train;  // the library these commands parse flags for
namespace {

struct Options {
  std::string dir;
  std::string params = "64M";
  std::string sub_group = "4M";
  int buffers = 4;
  unsigned qd = 32;
  std::string block = "1MiB";
  int iters = 3;
  bool json = false;
};

// Runs `strata bench io --json` once on dir and returns its mixed_gbps.
double bench_io_mixed(const Options& o, std::uint64_t size) {
  return run_self_json(str_cat("bench io --json --iters 1 --dir ", shell_quote(o.dir), " --size ", size, " --qd ", o.qd,
                               " --block ", shell_quote(o.block)),
                       "bench offload")
      .at("mixed_gbps")
      .get<double>();
}

Action setup(CLI::App& cmd) {
  auto o = std::make_shared<Options>();
  cmd.add_option("--dir", o->dir, "Directory on the NVMe device (swap files and the bench io file)")->required();
  cmd.add_option("--params", o->params, "fp32 AdamW parameters whose state is swapped (e.g. 64M)");
  cmd.add_option("--sub-group", o->sub_group, "Elements per sub-group (zero_optimization.sub_group_size)");
  cmd.add_option("--buffers", o->buffers, "Swap buffers (offload_optimizer.buffer_count)")->check(CLI::Range(1, 64));
  cmd.add_option("--qd", o->qd, "Queue depth for both measurements")->check(CLI::Range(1, 4096));
  cmd.add_option("--block", o->block, "I/O block size for both measurements");
  cmd.add_option("--iters", o->iters, "Pairs of measurements; figures are medians")->check(CLI::Range(1, 100));
  cmd.add_flag("--json", o->json, "Print JSON");
  return [o] {
    forward_io_warnings();
    const std::uint64_t n = parse_count(o->params, "--params");
    const std::uint64_t sub = parse_count(o->sub_group, "--sub-group");
    const std::uint64_t block = parse_bytes(o->block, "--block");
    STRATA_CHECK(n > 0 && sub > 0, Errc::invalid_argument, "--params and --sub-group must be > 0");
    offload::SwapperOptions so;
    so.dir = o->dir + "/strata-bench-offload-" + std::to_string(::getpid());
    so.sub_group_elems = sub;
    so.buffer_count = o->buffers;
    so.queue_depth = o->qd;
    so.block_bytes = static_cast<std::uint32_t>(block);
    InterruptScope interrupt;  // Ctrl-C ends at the next step, so the swap files are removed
    offload::OptimizerSwapper sw(so, {{"bench params", n}});

    std::vector<float> grad(n), master(n);
    std::vector<std::uint16_t> copy(n);
    std::mt19937 rng(7);
    std::normal_distribution<float> dist(0.0f, 0.02f);
    for (std::uint64_t i = 0; i < n; ++i) {
      master[i] = dist(rng);
      grad[i] = dist(rng);
    }
    sw.write_state(0, master.data());
    sw.commit_written();
    std::vector<float>().swap(master);
    const optim::AdamConfig adam{1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, true, true};
    std::int64_t step = 0;
    auto run_step = [&] {
      ++step;
      sw.step([&](const offload::SubGroup& g) {
        optim::StepArgs a;
        a.master = g.master;
        a.m = g.exp_avg;
        a.v = g.exp_avg_sq;
        a.grad = grad.data() + g.offset;
        a.copy = copy.data() + g.offset;
        a.copy_dtype = DType::bf16;
        a.n = g.elems;
        a.step = step;
        optim::adam_step(adam, a);
      });
      const auto st = sw.stats();
      return static_cast<double>(st.bytes_read + st.bytes_written) / st.step_seconds / 1e9;
    };
    run_step();  // warm-up: first touch of the files and buffers
    const std::uint64_t io_size = std::max<std::uint64_t>(io::align_up(sw.state_bytes(), block), 2 * block);
    std::vector<double> mixed, swap, ratio, compute_s, wait_s, step_s;
    for (int it = 0; it < o->iters; ++it) {
      check_interrupted("bench offload");
      mixed.push_back(bench_io_mixed(*o, io_size));
      check_interrupted("bench offload");
      swap.push_back(run_step());
      ratio.push_back(swap.back() / mixed.back());
      compute_s.push_back(sw.stats().compute_seconds);
      wait_s.push_back(sw.stats().wait_seconds);
      step_s.push_back(sw.stats().step_seconds);
    }
    nlohmann::json j = {{"dir", o->dir},
                        {"params", n},
                        {"sub_group_elems", sw.buffer_elems()},
                        {"sub_groups", sw.sub_groups()},
                        {"buffers", sw.buffer_count()},
                        {"buffer_bytes", sw.buffer_bytes()},
                        {"state_bytes", sw.state_bytes()},
                        {"queue_depth", o->qd},
                        {"block_bytes", block},
                        {"iters", o->iters},
                        {"swapper_gbps", median(swap)},
                        {"mixed_gbps", median(mixed)},
                        {"ratio", median(ratio)},
                        {"step_seconds", median(step_s)},
                        {"compute_seconds", median(compute_s)},
                        {"io_wait_seconds", median(wait_s)},
                        {"runs", {{"swapper_gbps", swap}, {"mixed_gbps", mixed}, {"ratio", ratio}}}};
    if (o->json) {
      print_json(j.dump(2));
      return 0;
    }
    std::printf("state:       %s of fp32 master/exp_avg/exp_avg_sq (%llu params) in %zu sub-groups of <= %llu\n",
                format_bytes(sw.state_bytes()).c_str(), static_cast<unsigned long long>(n), sw.sub_groups(),
                static_cast<unsigned long long>(sw.buffer_elems()));
    std::printf("buffers:     %d x %s pinned; queue depth %u, block %s\n", sw.buffer_count(),
                format_bytes(sw.buffer_bytes()).c_str(), o->qd, format_bytes(block).c_str());
    std::printf("swapper:     %8.3f GB/s read+written (step %.3f s, AdamW %.3f s, waiting on I/O %.3f s)\n",
                median(swap), median(step_s), median(compute_s), median(wait_s));
    std::printf("bench io:    %8.3f GB/s mixed r/w (same directory, same run)\n", median(mixed));
    std::printf("ratio:       %8.3f (median of %d pairs; target >= 0.8)\n", median(ratio), o->iters);
    return 0;
  };
}

const Registration reg("bench", "offload",
                       "NVMe optimizer swapper bandwidth vs `bench io` mixed bandwidth on the same directory", setup);

}  // namespace
}  // namespace strata::cli
