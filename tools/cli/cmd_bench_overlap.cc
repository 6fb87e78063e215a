// `strata bench overlap`: does offloading hide its I/O behind compute? In one run, on one
// directory: (1) `strata bench io` measures the drive's read and write GB/s; (2) the demo
// MLP trains at ZeRO stage 3 with everything on the device and an unthrottled link: its
// median step time is the compute time (real math plus --layer-ms of simulated work per
// layer forward, twice that backward); (3) the same model trains with its parameter shards
// on NVMe (offload_param nvme), optimizer state in host RAM (offload_optimizer cpu), the
// host link throttled to --link-gbps and a device budget of a few layers, every gather
// reading its layer from NVMe (stage3_max_reuse_distance 0). The I/O time of a step is each
// of its counted transfers at its rate (NVMe bytes at the measured GB/s, H2D and D2H bytes at
// the link's), summed. Reports the medians and step / max(compute, I/O): 1.0 is perfect
// overlap, (compute + I/O) / max(compute, I/O) is none; and, tighter, step / max(compute,
// the busiest single resource), for I/O that also overlaps itself (drive, H2D, D2H).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <vector>

#include "engine/engine.h"
#include "models/mlp.h"
#include "runtime/core/error.h"
#include "runtime/core/stats.h"
#include "runtime/core/units.h"
#include "runtime/device/device.h"
#include "tools/cli/command.h"
#include "train/bench_child.h"
#include "train/interrupt.h"
#include "train/output_check.h"

namespace strata::cli {

using namespace strata::train;  // the library these commands parse flags for
namespace {

struct Options {
  std::string dir;
  int layers = 8;
  int hidden = 1024;
  double layer_ms = 4.0;
  double link_gbps = 4.0;
  int steps = 6;
  int accum = 1;
  std::string io_size = "256MiB";
  bool json = false;
};

struct Run {
  std::vector<double> step_ms;
  std::vector<engine::IoStats> io;
};

Run train(const Options& o, bool offload) {
  engine::EngineConfig c;
  c.zero.stage = 3;
  c.bf16 = true;
  c.train_micro_batch_size_per_gpu = 2;
  c.gradient_accumulation_steps = o.accum;
  c.train_batch_size = 2 * o.accum;
  c.zero.overlap_comm = true;
  c.zero.reduce_bucket_size = 1u << 30;
  c.zero.stage3_param_persistence_threshold = 0;
  const std::uint64_t layer_elems = static_cast<std::uint64_t>(o.hidden) * (o.hidden + 1);
  c.zero.stage3_prefetch_bucket_size = 2 * layer_elems;  // two layers ahead
  c.zero.stage3_max_reuse_distance = 0;                  // every gather comes from the shard's tier
  c.optimizer.lr = 1e-3f;
  device::DeviceOptions d;
  d.budget_bytes = std::uint64_t{8} << 30;
  if (offload) {
    c.offload_param.device = engine::OffloadDevice::nvme;
    c.offload_param.nvme_path = o.dir;
    c.offload_param.max_in_cpu = 0;
    c.offload_param.buffer_size = layer_elems;
    c.offload_optimizer.device = engine::OffloadDevice::cpu;
    c.offload_optimizer.pin_memory = true;
    c.aio.queue_depth = 32;
    d.budget_bytes = layer_elems * 2 * 6;  // room for the live window and two prefetched layers
    d.link_gbps = o.link_gbps;
  }
  auto dev = device::Device::create(d);
  engine::EngineOptions eo;
  eo.config = c;
  eo.device = dev.get();
  eo.seed = 1;
  engine::Engine engine(eo);
  model::Mlp mlp(engine, {o.layers, o.hidden, o.layer_ms, 1});
  engine.setup();
  Run r;
  for (int s = 0; s < o.steps; ++s) {
    check_interrupted("bench overlap");
    const auto t0 = std::chrono::steady_clock::now();
    (void)mlp.train_step(s);
    if (s == 0) continue;  // step 1 records the gather trace: no prefetch yet
    r.step_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    r.io.push_back(engine.io_stats());
  }
  return r;
}

double median_of(const std::vector<engine::IoStats>& v, std::uint64_t engine::IoStats::*field) {
  std::vector<double> x;
  for (const auto& s : v) x.push_back(static_cast<double>(s.*field));
  return median(x);
}

Action setup(CLI::App& cmd) {
  auto o = std::make_shared<Options>();
  cmd.add_option("--dir", o->dir, "Directory on the NVMe drive")->required();
  cmd.add_option("--layers", o->layers, "MLP layers")->check(CLI::Range(2, 1000));
  cmd.add_option("--hidden", o->hidden, "MLP hidden size")->check(CLI::Range(16, 16384));
  cmd.add_option("--layer-ms", o->layer_ms, "Simulated compute per layer forward (backward: twice)")
      ->check(CLI::NonNegativeNumber);
  cmd.add_option("--link-gbps", o->link_gbps, "Host link throttle for the offloaded run (GB/s)")
      ->check(CLI::PositiveNumber);
  cmd.add_option("--steps", o->steps, "Steps per run (the first is not timed)")->check(CLI::Range(2, 1000));
  cmd.add_option("--accum", o->accum, "Micro-batches per step")->check(CLI::Range(1, 64));
  cmd.add_option("--io-size", o->io_size, "File size for the NVMe bandwidth measurement");
  cmd.add_flag("--json", o->json, "Print JSON");
  return [o] {
    InterruptScope interrupt;           // Ctrl-C ends at the next step, so the swap files are removed
    check_output_dir("--dir", o->dir);  // created when missing, as strata train creates nvme_path
    const auto bw = run_self_json(
        str_cat("bench io --json --iters 1 --dir ", shell_quote(o->dir), " --size ", shell_quote(o->io_size)),
        "bench overlap");
    const double read_gbps = bw.at("read_gbps").get<double>(), write_gbps = bw.at("write_gbps").get<double>();
    const Run compute = train(*o, false);
    const Run off = train(*o, true);
    const double compute_ms = median(compute.step_ms), step_ms = median(off.step_ms);
    const double rd = median_of(off.io, &engine::IoStats::nvme_read_bytes);
    const double wr = median_of(off.io, &engine::IoStats::nvme_write_bytes);
    const double h2d = median_of(off.io, &engine::IoStats::h2d_bytes);
    const double d2h = median_of(off.io, &engine::IoStats::d2h_bytes);
    const double nvme_ms = (rd / read_gbps + wr / write_gbps) / 1e6;
    const double link_ms = (h2d + d2h) / o->link_gbps / 1e6;
    const double io_ms = nvme_ms + link_ms;
    // The tighter bound: each resource (the drive, each link direction) busy on its own.
    const double busiest_ms = std::max({nvme_ms, h2d / o->link_gbps / 1e6, d2h / o->link_gbps / 1e6});
    std::vector<double> waits;
    for (const auto& s : off.io) waits.push_back(s.io_wait_seconds * 1e3);
    const double bound = std::max(compute_ms, io_ms);
    nlohmann::json j = {{"dir", o->dir},
                        {"layers", o->layers},
                        {"hidden", o->hidden},
                        {"layer_ms", o->layer_ms},
                        {"link_gbps", o->link_gbps},
                        {"nvme_read_gbps", read_gbps},
                        {"nvme_write_gbps", write_gbps},
                        {"steps_timed", off.step_ms.size()},
                        {"compute_ms", compute_ms},
                        {"nvme_read_bytes", rd},
                        {"nvme_write_bytes", wr},
                        {"h2d_bytes", h2d},
                        {"d2h_bytes", d2h},
                        {"nvme_ms", nvme_ms},
                        {"link_ms", link_ms},
                        {"io_ms", io_ms},
                        {"step_ms", step_ms},
                        {"io_wait_ms", median(waits)},
                        {"ratio_to_max", step_ms / bound},
                        {"busiest_resource_ms", busiest_ms},
                        {"ratio_to_busiest", step_ms / std::max(compute_ms, busiest_ms)},
                        {"ratio_if_serial", (compute_ms + io_ms) / bound}};
    if (o->json) {
      print_json(j.dump(2));
      return 0;
    }
    std::printf("overlap: mlp %d x %d, stage 3, parameters on NVMe (%s), optimizer in host RAM, link %.2f GB/s\n",
                o->layers, o->hidden, o->dir.c_str(), o->link_gbps);
    std::printf("  NVMe measured (bench io): read %.3f GB/s, write %.3f GB/s\n", read_gbps, write_gbps);
    std::printf("  compute (all on device), median step   %8.1f ms\n", compute_ms);
    std::printf("  I/O per step: NVMe read %s + write %s = %.1f ms, link H2D %s + D2H %s = %.1f ms; total %.1f ms\n",
                format_bytes(static_cast<std::uint64_t>(rd)).c_str(),
                format_bytes(static_cast<std::uint64_t>(wr)).c_str(), nvme_ms,
                format_bytes(static_cast<std::uint64_t>(h2d)).c_str(),
                format_bytes(static_cast<std::uint64_t>(d2h)).c_str(), link_ms, io_ms);
    std::printf("  offloaded, median step                 %8.1f ms (waited on I/O %.1f ms)\n", step_ms, median(waits));
    std::printf("  step / max(compute, I/O) = %.3f   (no overlap would be %.3f)\n", step_ms / bound,
                (compute_ms + io_ms) / bound);
    std::printf("  step / max(compute, busiest resource %.1f ms: drive, H2D or D2H alone) = %.3f\n", busiest_ms,
                step_ms / std::max(compute_ms, busiest_ms));
    return 0;
  };
}

const Registration reg("bench", "overlap", "Offloaded step time against max(compute, I/O): is the I/O hidden?", setup);

}  // namespace
}  // namespace strata::cli
