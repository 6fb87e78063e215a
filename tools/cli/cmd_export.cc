// `strata export --checkpoint DIR --out OUT [--format safetensors|hf] [--dtype fp32|bf16|fp16]
// [--max-shard-size 5GB]`: the checkpoint's fp32 master weights, consolidated from every
// rank's shards, under the model's own tensor names (the GPT's are Hugging Face's GPT-2
// names; the Llama family's are Hugging Face's). --format safetensors (the default) writes
// OUT as one safetensors file; --format hf writes OUT as a Hugging Face model directory
// (config.json from the checkpoint, weights sharded at --max-shard-size, export_writers.h),
// for a model whose checkpoint records its Hugging Face config. Streaming: each tensor is
// read (chunks verified against their checksums) and written in pieces of at most 1M
// elements, so the memory used is a few fixed buffers, not the model; the peak RSS is
// printed. The output appears only when complete (rename of OUT.tmp).
//
// What is read is never written: an --out that is the checkpoint (its root or step
// directory), lies inside it, or is one of its files under another name (a hard or symbolic
// link, as is OUT.tmp) is refused before any byte is written, naming both paths. Partial
// output never outlives the command: the writer's OUT.tmp is removed when an error unwinds
// it, Ctrl-C, SIGTERM or SIGHUP stop the export at the next piece (interrupt.h) and remove it
// the same way, and a file size limit (ulimit -f) ends in EFBIG and that cleanup, not in
// SIGXFSZ.
#include <sys/resource.h>
#include <sys/stat.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/directory.h"
#include "models/hf/format.h"
#include "models/safetensors.h"
#include "runtime/core/error.h"
#include "runtime/core/units.h"
#include "tools/cli/command.h"
#include "tools/cli/export_writers.h"
#include "train/interrupt.h"
#include "train/output_check.h"

namespace strata::cli {

using namespace strata::train;  // the library these commands parse flags for
namespace {

struct Options {
  std::string checkpoint, out, dtype = "fp32", format = "safetensors", max_shard_size = "5GB";
  bool max_shard_size_given = false;
};

namespace fs = std::filesystem;
using FileId = std::pair<dev_t, ino_t>;

// The file `path` names (links followed), if it exists.
std::optional<FileId> file_id(const fs::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return FileId{st.st_dev, st.st_ino};
}

// Refuses an --out that is, or lies inside, one of `dirs` (compared by inode, so links and
// bind mounts of the directory count too): every ancestor of its resolved path is checked.
// `label` names the path in the message (default: "--out 'OUT'").
void refuse_out_inside(const std::string& out, const std::string& checkpoint, const std::vector<std::string>& dirs,
                       const std::string& label = "") {
  if (out.empty()) return;  // check_output_file names it
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::absolute(out), ec);
  if (ec) p = fs::absolute(out);
  std::vector<std::pair<std::string, FileId>> ids;
  for (const auto& d : dirs)
    if (const auto id = file_id(d)) ids.emplace_back(d, *id);
  for (fs::path a = p;; a = a.parent_path()) {
    if (const auto id = file_id(a)) {
      for (const auto& [dir, did] : ids) {
        STRATA_CHECK(*id != did, Errc::invalid_argument, label.empty() ? "--out '" + out + "'" : label, " ",
                     a == p ? "is" : "lies inside", " the checkpoint directory '", dir, "' that --checkpoint '",
                     checkpoint, "' reads: write the export outside the checkpoint");
      }
    }
    if (a == a.parent_path() || a.empty()) break;
  }
}

// Refuses an --out (or its temporary OUT.tmp) that is one of the checkpoint's files under
// another name (a hard or symbolic link): every entry of the step directory and the root's
// `latest`. The rename would only replace the link, but a user who names a checkpoint file
// as the output has mistaken one path for another, and the export would not be where meant.
void refuse_out_aliasing(const std::string& out, const std::string& checkpoint, const std::string& step_dir) {
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(step_dir, ec)) files.push_back(e.path().string());
  files.push_back((fs::path(step_dir).parent_path() / checkpoint::kLatestName).string());
  for (const std::string& o : {out, out + ".tmp"}) {
    const auto id = file_id(o);
    if (!id) continue;
    for (const auto& f : files) {
      STRATA_CHECK(file_id(f) != id, Errc::invalid_argument, "--out '", out, "': '", o, "' is the checkpoint's file '",
                   f, "' (a link to it) that --checkpoint '", checkpoint,
                   "' reads: write the export to a new file outside the checkpoint");
    }
  }
}

// While it lives, a write past a file size limit fails with EFBIG (and the writer's
// cleanup) instead of killing the process with SIGXFSZ.
class IgnoreFileSizeSignal {
 public:
  IgnoreFileSizeSignal() {
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    sigaction(SIGXFSZ, &ignore, &old_);
  }
  ~IgnoreFileSizeSignal() { sigaction(SIGXFSZ, &old_, nullptr); }
  IgnoreFileSizeSignal(const IgnoreFileSizeSignal&) = delete;
  IgnoreFileSizeSignal& operator=(const IgnoreFileSizeSignal&) = delete;

 private:
  struct sigaction old_ {};
};

// Refuses an --out directory whose temporary sibling, through which HfDirWriter writes it
// ("hf/" -> "hf.tmp"), is or lies inside one of `dirs`.
void refuse_tmp_inside(const std::string& out, const std::string& checkpoint, const std::vector<std::string>& dirs) {
  std::string tmp = out;
  while (tmp.size() > 1 && tmp.back() == '/') tmp.pop_back();
  tmp += ".tmp";
  refuse_out_inside(tmp, checkpoint, dirs, "--out '" + out + "', written through '" + tmp + "',");
}

int run(const Options& o) {
  STRATA_CHECK(o.dtype == "fp32" || o.dtype == "bf16" || o.dtype == "fp16", Errc::invalid_argument, "--dtype ", o.dtype,
               " is not offered: use fp32, bf16 or fp16");
  STRATA_CHECK(o.format == "safetensors" || o.format == "hf", Errc::invalid_argument, "--format ", o.format,
               " is not offered: use safetensors (one file) or hf (a Hugging Face model directory)");
  const bool hf = o.format == "hf";
  STRATA_CHECK(hf || !o.max_shard_size_given, Errc::invalid_argument,
               "--max-shard-size splits a Hugging Face directory's weights: it needs --format hf (--format "
               "safetensors writes one file)");
  const std::uint64_t max_shard_bytes = hf ? model::hf::parse_shard_bytes(o.max_shard_size) : 0;
  const DType dt = o.dtype == "fp32" ? DType::fp32 : o.dtype == "bf16" ? DType::bf16 : DType::fp16;
  refuse_out_inside(o.out, o.checkpoint, {o.checkpoint});
  if (hf) {
    refuse_tmp_inside(o.out, o.checkpoint, {o.checkpoint});
  } else {
    check_output_file("--out", o.out);
  }
  const auto t0 = std::chrono::steady_clock::now();
  const auto opened = checkpoint::open_checkpoint(o.checkpoint);
  refuse_out_inside(o.out, o.checkpoint, {opened.dir});
  if (hf) refuse_tmp_inside(o.out, o.checkpoint, {opened.dir});
  refuse_out_aliasing(o.out, o.checkpoint, opened.dir);
  const auto& m = opened.manifest;
  const std::string config = hf ? hf_config_text(m, o.checkpoint) : std::string();
  // Before the writer creates OUT.tmp: a signal from here on stops the loop, whose throw
  // unwinds the writer (removing OUT.tmp) while the handlers are still this scope's.
  InterruptScope interrupts;
  IgnoreFileSizeSignal file_size_limit;
  std::string files;
  if (hf) {
    const auto shards = export_hf(opened.dir, m, o.out, dt, max_shard_bytes, config);
    files = shards.size() == 1 ? std::string(" (") + shards.front() + ")" : str_cat(" (", shards.size(), " shards)");
  } else {
    std::vector<model::TensorInfo> info;
    for (const auto& t : m.tensors) info.push_back({t.name, dt, t.shape});
    model::SafetensorsWriter w(
        o.out, std::move(info),
        {{"format", "pt"}, {"producer", "strata export"}, {"step", std::to_string(m.step)}, {"source", opened.dir}});
    stream_masters(opened.dir, m, o.out, [&](const float* v, std::uint64_t n) { w.write(v, n); });
    w.finish();
  }
  std::uint64_t elems = 0;
  for (const auto& t : m.tensors) elems += t.numel;
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  std::printf("exported %zu tensors (%llu elements, %s) from %s to %s%s in %.2f s; peak RSS %s\n", m.tensors.size(),
              static_cast<unsigned long long>(elems), format_bytes(elems * dtype_size(dt)).c_str(), opened.dir.c_str(),
              o.out.c_str(), files.c_str(), s, format_bytes(static_cast<std::uint64_t>(ru.ru_maxrss) * 1024).c_str());
  return 0;
}

Action setup(CLI::App& cmd) {
  auto o = std::make_shared<Options>();
  cmd.add_option("--checkpoint", o->checkpoint, "A save directory (its latest checkpoint) or a step-N directory")
      ->required();
  cmd.add_option("--out", o->out, "The safetensors file (--format safetensors) or directory (--format hf) to write")
      ->required();
  cmd.add_option("--format", o->format,
                 "safetensors (default): one file; hf: a Hugging Face model directory (config.json, sharded weights)");
  cmd.add_option("--dtype", o->dtype, "fp32 (default), bf16 or fp16 (rounded to nearest even)");
  auto* shard = cmd.add_option("--max-shard-size", o->max_shard_size,
                               "--format hf: the largest weight file, as Hugging Face writes it (5GB default, 500MB, "
                               "2GiB or bytes); a larger tensor gets a file of its own");
  return [o, shard] {
    o->max_shard_size_given = shard->count() > 0;
    return run(*o);
  };
}

const Registration reg("", "export",
                       "Write a checkpoint's weights as one safetensors file or a Hugging Face directory (streaming)",
                       setup);

}  // namespace
}  // namespace strata::cli
