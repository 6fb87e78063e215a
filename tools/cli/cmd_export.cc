// `strata export --checkpoint DIR --out model.safetensors [--dtype fp32|bf16|fp16]`: the
// checkpoint's fp32 master weights, consolidated from every rank's shards, as one
// safetensors file under the model's own tensor names (the GPT's are Hugging Face's GPT-2
// names). Streaming: each tensor is read (chunks verified against their checksums) and
// written in pieces of at most 1M elements, so the memory used is a few fixed buffers, not
// the model; the peak RSS is printed. The file appears only when complete (rename).
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <vector>

#include "checkpoint/directory.h"
#include "checkpoint/shard_file.h"
#include "models/safetensors.h"
#include "runtime/core/error.h"
#include "runtime/core/units.h"
#include "tools/cli/command.h"
#include "tools/cli/output_check.h"

namespace strata::cli {
namespace {

struct Options {
  std::string checkpoint, out, dtype = "fp32";
};

int run(const Options& o) {
  STRATA_CHECK(o.dtype == "fp32" || o.dtype == "bf16" || o.dtype == "fp16", Errc::invalid_argument, "--dtype ", o.dtype,
               " is not offered: use fp32, bf16 or fp16");
  const DType dt = o.dtype == "fp32" ? DType::fp32 : o.dtype == "bf16" ? DType::bf16 : DType::fp16;
  check_output_file("--out", o.out);
  const auto t0 = std::chrono::steady_clock::now();
  const auto opened = checkpoint::open_checkpoint(o.checkpoint);
  const auto& m = opened.manifest;
  std::vector<model::TensorInfo> info;
  for (const auto& t : m.tensors) info.push_back({t.name, dt, t.shape});
  model::SafetensorsWriter w(
      o.out, std::move(info),
      {{"format", "pt"}, {"producer", "strata export"}, {"step", std::to_string(m.step)}, {"source", opened.dir}});
  checkpoint::ShardReader reader(opened.dir, m);
  constexpr std::uint64_t kPiece = std::uint64_t{1} << 20;
  std::vector<float> piece;
  std::uint64_t elems = 0;
  for (const auto& t : m.tensors) {
    for (std::uint64_t e = 0; e < t.numel; e += kPiece) {
      const std::uint64_t n = std::min(kPiece, t.numel - e);
      piece.resize(n);
      reader.read_tensor(t, checkpoint::State::master, e, n, piece.data());
      w.write(piece.data(), n);
    }
    elems += t.numel;
  }
  w.finish();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  std::printf("exported %zu tensors (%llu elements, %s) from %s to %s in %.2f s; peak RSS %s\n", m.tensors.size(),
              static_cast<unsigned long long>(elems), format_bytes(elems * dtype_size(dt)).c_str(), opened.dir.c_str(),
              o.out.c_str(), s, format_bytes(static_cast<std::uint64_t>(ru.ru_maxrss) * 1024).c_str());
  return 0;
}

Action setup(CLI::App& cmd) {
  auto o = std::make_shared<Options>();
  cmd.add_option("--checkpoint", o->checkpoint, "A save directory (its latest checkpoint) or a step-N directory")
      ->required();
  cmd.add_option("--out", o->out, "The safetensors file to write")->required();
  cmd.add_option("--dtype", o->dtype, "fp32 (default), bf16 or fp16 (rounded to nearest even)");
  return [o] { return run(*o); };
}

const Registration reg("", "export", "Write a checkpoint's weights as one safetensors file (streaming)", setup);

}  // namespace
}  // namespace strata::cli
