// The trainers' flags (see flags.h).
#include "tools/cli/flags.h"

#include "runtime/core/error.h"

namespace strata::cli {

using train::check_model_options;
using train::CheckpointFlags;
using train::ModelOptions;
using train::StepPrinting;

void add_model_options(CLI::App& cmd, ModelOptions& m) {
  cmd.add_option("--model", m.model,
                 "Model: mlp (the demo), gpt, or DIR: a Hugging Face model directory (config.json and safetensors) "
                 "of a Llama, Mistral, Qwen2 or Qwen3 decoder");
  cmd.add_option("--layers", m.layers, "Layers (MLP: default 4; GPT: blocks, default the preset's)")
      ->check(CLI::Range(1, 100000));
  cmd.add_option("--hidden", m.hidden, "MLP hidden size (default 64)")->check(CLI::Range(1, 1 << 20));
  add_gpt_shape_options(cmd, m);
}

void check_model_flags(const CLI::App& cmd, const std::string& model) {
  check_model_options(
      model,
      [&](const std::string& flag) {
        const CLI::Option* opt = cmd.get_option_no_throw(flag);
        return opt != nullptr && opt->count() > 0;
      },
      [](const std::string& flag) { return flag; });
}

void add_gpt_shape_options(CLI::App& cmd, ModelOptions& m) {
  cmd.add_option("--preset", m.preset, "GPT size: tiny|124M|350M|774M|1.5B");
  cmd.add_option("--heads", m.heads, "GPT attention heads")->check(CLI::Range(1, 4096));
  cmd.add_option("--d-model", m.d_model, "GPT width")->check(CLI::Range(1, 1 << 16));
  cmd.add_option("--seq-len", m.seq_len, "GPT training sequence length (default: the position table's)")
      ->check(CLI::Range(1, 1 << 20));
  cmd.add_option("--positions", m.positions, "GPT position table rows (default: the preset's, else --seq-len)")
      ->check(CLI::Range(1, 1 << 20));
  cmd.add_option("--vocab", m.vocab, "GPT vocabulary (default: the preset's; 256 for bytes)")
      ->check(CLI::Range(2, 65536));
  cmd.add_option("--remat", m.remat,
                 "GPT re-materialization: never|except_last|always (default: always when the config "
                 "has activation_checkpointing, else never)");
  cmd.add_flag(
      "--unit-scaled", m.unit_scaled,
      "GPT with unit scaling: weights at unit scale and fixed scales on every op, so it trains in fp16 "
      "and fp8 with no loss scaler (fp16 needs fp16.loss_scale 1; gradient_clipping is in the unit-scaled norm)");
}

void add_checkpoint_options(CLI::App& cmd, CheckpointFlags& f) {
  cmd.add_option(
      "--save-dir", f.save_dir,
      "Save checkpoints under this directory (step-N/, 'latest'); default: the config's checkpoint.save_dir");
  cmd.add_option("--save-every", f.save_every, "Save every N steps (0: only after the last step)")
      ->check(CLI::NonNegativeNumber);
  cmd.add_option("--keep", f.keep, "Keep the newest K checkpoints (0: all)")->check(CLI::NonNegativeNumber);
  cmd.add_flag("--save-async", f.async,
               "Write checkpoints in the background while training goes on (staging in host memory, within "
               "memory_budget.host)");
  cmd.add_option("--resume", f.resume,
                 "Continue from a checkpoint: a save directory (its latest), a step-N directory, or 'latest' "
                 "(the latest under --save-dir)");
  cmd.add_option("--init-from", f.init_from,
                 "Start from these weights (safetensors with this model's tensor names, e.g. from strata export)");
}

void add_printing_flags(CLI::App& cmd, StepPrinting::Level& level) {
  auto* quiet = cmd.add_flag_callback(
      "--quiet", [&level] { level = StepPrinting::Level::quiet; },
      "Print only the steps with a validation loss and the last one (--log-json keeps every step)");
  cmd.add_flag_callback(
         "--verbose", [&level] { level = StepPrinting::Level::verbose; },
         "Print every detail of each step: memory per tier (current and peak), RSS, bytes per link and to NVMe")
      ->excludes(quiet);
}

}  // namespace strata::cli
