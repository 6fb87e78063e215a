// `strata checkpoint verify PATH` reads every chunk of a checkpoint and checks it against the
// manifest's XXH3 sums (a bad one is named: file, chunk, the tensors it holds), exit 0 when
// all is well; `strata checkpoint show PATH` prints what the manifest says. PATH is a save
// directory (its latest checkpoint) or a step-N directory.
#include <chrono>
#include <cstdio>

#include "checkpoint/directory.h"
#include "checkpoint/shard_file.h"
#include "runtime/core/units.h"
#include "tools/cli/command.h"

namespace strata::cli {
namespace {

Action verify_setup(CLI::App& cmd) {
  auto path = std::make_shared<std::string>();
  cmd.add_option("path", *path, "A save directory (its latest checkpoint) or a step-N directory")->required();
  return [path] {
    const auto t0 = std::chrono::steady_clock::now();
    const auto opened = checkpoint::open_checkpoint(*path);
    checkpoint::ShardReader reader(opened.dir, opened.manifest);
    reader.verify_all();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%s: step %lld, %zu tensors, %zu files, %s verified in %.3f s\n", opened.dir.c_str(),
                static_cast<long long>(opened.manifest.step), opened.manifest.tensors.size(),
                opened.manifest.files.size(), format_bytes(opened.manifest.payload_bytes()).c_str(), s);
    return 0;
  };
}

Action show_setup(CLI::App& cmd) {
  auto path = std::make_shared<std::string>();
  cmd.add_option("path", *path, "A save directory (its latest checkpoint) or a step-N directory")->required();
  return [path] {
    const auto opened = checkpoint::open_checkpoint(*path);
    const auto& m = opened.manifest;
    std::printf("%s\n  step %lld, saved at world size %d, ZeRO stage %d, %s compute\n  engine %s\n  trainer %s\n",
                opened.dir.c_str(), static_cast<long long>(m.step), m.world_size, m.zero_stage, m.compute_dtype.c_str(),
                m.engine_state.c_str(), m.trainer_state.c_str());
    for (const auto& f : m.files) {
      std::printf("  %s (rank %d): %s, %zu chunks\n", f.name.c_str(), f.rank, format_bytes(f.bytes).c_str(),
                  f.xxh3.size());
    }
    std::uint64_t elems = 0;
    for (const auto& t : m.tensors) elems += t.numel;
    std::printf("  %zu tensors, %llu elements\n", m.tensors.size(), static_cast<unsigned long long>(elems));
    return 0;
  };
}

const Registration verify_reg("checkpoint", "verify", "Check every chunk of a checkpoint against its checksums",
                              verify_setup);
const Registration show_reg("checkpoint", "show", "Print a checkpoint's manifest: step, world, stage, files, tensors",
                            show_setup);

}  // namespace
}  // namespace strata::cli
