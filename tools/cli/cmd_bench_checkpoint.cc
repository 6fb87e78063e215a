// `strata bench checkpoint --dir D`: the save time of optimizer state that lives on NVMe,
// hard-linked into the checkpoint (SaveOptions::link_nvme) against copied through host
// memory into the shard file (what a checkpoint of state in RAM does), alternated on the
// same engine and directory; medians over --iters pairs, the bytes of state, the copy's
// GB/s and the ratio. The engine holds an MLP of --layers x --hidden (ZeRO stage 1, fp32,
// optimizer state on NVMe under D) as initialised by setup(): the state's values do not
// change the I/O.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <vector>

#include "engine/engine.h"
#include "models/mlp.h"
#include "runtime/core/error.h"
#include "runtime/core/stats.h"
#include "runtime/core/units.h"
#include "runtime/device/device.h"
#include "tools/cli/command.h"
#include "train/interrupt.h"

namespace strata::cli {

using namespace strata::train;  // the library these commands parse flags for
namespace {

struct Options {
  std::string dir;
  int layers = 8, hidden = 1024, iters = 3;
  std::string sub_group = "4M";
  bool json = false;
};

int run(const Options& o) {
  namespace fs = std::filesystem;
  const std::string nvme = o.dir + "/swap", ck = o.dir + "/checkpoints";
  device::DeviceOptions d;
  d.budget_bytes = std::uint64_t{16} << 30;  // the parameters' fp32 copies live there (stage 1)
  auto dev = device::Device::create(d);
  engine::EngineOptions eo;
  eo.config.train_batch_size = eo.config.train_micro_batch_size_per_gpu = eo.config.gradient_accumulation_steps = 1;
  eo.config.zero.stage = 1;
  eo.config.zero.sub_group_size = parse_count(o.sub_group, "--sub-group");
  eo.config.offload_optimizer.device = engine::OffloadDevice::nvme;
  eo.config.offload_optimizer.nvme_path = nvme;
  eo.device = dev.get();
  engine::Engine engine(eo);
  model::Mlp mlp(engine, {o.layers, o.hidden, 0, 1});
  InterruptScope interrupt;
  engine.setup();
  const std::uint64_t state = mlp.parameter_count() * 12;
  std::vector<double> link_s, copy_s;
  std::uint64_t copied = 0;
  for (int i = 0; i < o.iters; ++i) {
    for (bool link : {true, false}) {
      check_interrupted("bench checkpoint");
      engine::SaveOptions so;
      so.link_nvme = link;
      so.keep = 1;
      const auto r = engine.save_checkpoint(ck, "{}", so);
      (link ? link_s : copy_s).push_back(r.seconds);
      if (!link) copied = r.bytes;
    }
  }
  fs::remove_all(ck);
  const double l = median(link_s), c = median(copy_s);
  if (o.json) {
    print_json(nlohmann::json{
        {"state_bytes", state},
        {"copied_bytes", copied},
        {"link_seconds", l},
        {"copy_seconds", c},
        {"copy_gbps", static_cast<double>(copied) / c / 1e9},
        {"copy_over_link",
         c / l}}.dump());
  } else {
    std::printf("NVMe optimizer state %s (%llu parameters); save, median of %d:\n", format_bytes(state).c_str(),
                static_cast<unsigned long long>(mlp.parameter_count()), o.iters);
    std::printf("  linked:  %8.4f s\n  copied:  %8.4f s (%s through host memory, %.2f GB/s)\n  copy / link: %.1fx\n", l,
                c, format_bytes(copied).c_str(), static_cast<double>(copied) / c / 1e9, c / l);
  }
  return 0;
}

Action setup(CLI::App& cmd) {
  auto o = std::make_shared<Options>();
  cmd.add_option("--dir", o->dir, "Directory on the NVMe device (swap files and checkpoints)")->required();
  cmd.add_option("--layers", o->layers, "MLP layers")->check(CLI::Range(1, 10000));
  cmd.add_option("--hidden", o->hidden, "MLP width (parameters: layers x hidden^2)")->check(CLI::Range(1, 1 << 16));
  cmd.add_option("--sub-group", o->sub_group, "Elements per swap file (zero_optimization.sub_group_size)");
  cmd.add_option("--iters", o->iters, "Pairs of saves; figures are medians")->check(CLI::Range(1, 100));
  cmd.add_flag("--json", o->json, "Print JSON");
  return [o] { return run(*o); };
}

const Registration reg("bench", "checkpoint", "Save time of NVMe optimizer state: hard-linked against copied", setup);

}  // namespace
}  // namespace strata::cli
