// The outputs of strata export (see export_writers.h).
#include "tools/cli/export_writers.h"

#include <nlohmann/json.hpp>

#include "checkpoint/shard_file.h"
#include "models/hf/dir_writer.h"
#include "runtime/core/error.h"
#include "runtime/core/progress.h"
#include "train/interrupt.h"

namespace strata::cli {

using namespace strata::train;  // the library these commands parse flags for

void stream_masters(const std::string& step_dir, const checkpoint::Manifest& m, const std::string& out,
                    const std::function<void(const float*, std::uint64_t)>& sink) {
  checkpoint::ShardReader reader(step_dir, m);
  constexpr std::uint64_t kPiece = std::uint64_t{1} << 20;
  std::vector<float> piece;
  std::uint64_t total = 0;
  for (const auto& t : m.tensors) total += t.numel * 4;
  Progress progress("export (fp32 masters read)", total);
  for (const auto& t : m.tensors) {
    for (std::uint64_t e = 0; e < t.numel; e += kPiece) {
      if (interrupt_pending()) {
        STRATA_THROW(Errc::invalid_argument, "export: interrupted by signal ", interrupt_signal(), " at tensor '",
                     t.name, "'; the partial '", out, ".tmp' was removed and '", out, "' left as it was");
      }
      const std::uint64_t n = std::min(kPiece, t.numel - e);
      piece.resize(n);
      reader.read_tensor(t, checkpoint::State::master, e, n, piece.data());
      sink(piece.data(), n);
      progress.advance(n * 4);
    }
  }
}

std::string hf_config_text(const checkpoint::Manifest& m, const std::string& checkpoint) {
  const auto state = nlohmann::json::parse(m.trainer_state, nullptr, false);
  const bool recorded = state.is_object() && state.contains("model") && state["model"].is_object() &&
                        state["model"].contains("hf_config");
  STRATA_CHECK(recorded, Errc::invalid_argument, "--checkpoint '", checkpoint,
               "': --format hf needs the model's Hugging Face config.json, and this checkpoint records none (strata "
               "train records it as model.hf_config for a Llama-family model loaded from a Hugging Face directory; "
               "the GPT and the MLP have none): export it with --format safetensors, one file under the model's own "
               "tensor names");
  const auto& config = state["model"]["hf_config"];
  STRATA_CHECK(config.is_object(), Errc::corrupt, "--checkpoint '", checkpoint,
               "': the trainer state's model.hf_config is a JSON ", config.type_name(),
               ", not the config.json object: the checkpoint is damaged");
  return config.dump(2);
}

std::vector<std::string> export_hf(const std::string& step_dir, const checkpoint::Manifest& m, const std::string& out,
                                   DType dtype, std::uint64_t max_shard_bytes, const std::string& config_text) {
  model::HfDirWriter::Tensors tensors;
  for (const auto& t : m.tensors) tensors.emplace_back(t.name, t.shape);
  model::HfDirWriter w(out, config_text, tensors, dtype, max_shard_bytes,
                       {{"producer", "strata export"}, {"step", std::to_string(m.step)}, {"source", step_dir}});
  stream_masters(step_dir, m, out, [&](const float* v, std::uint64_t n) { w.write(v, n); });
  w.finish();
  return w.shard_files();
}

}  // namespace strata::cli
