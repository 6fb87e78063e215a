// The flags the trainers' options come from (train/): each adds its options to a command,
// written into the train/ struct that the library reads.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "train/checkpoints.h"
#include "train/model.h"
#include "train/step_report.h"

namespace strata::cli {

// Adds the model's flags: --model, --layers, --hidden and the GPT's shape.
void add_model_options(CLI::App& cmd, train::ModelOptions& m);
// Refuses a flag given on `cmd` that only the other model reads (--heads, --data or
// --sample with --model mlp; --hidden or --layer-ms with --model gpt), naming it and the
// model that takes it: left unread, it would train or size another model than the one asked
// for. Flags `cmd` does not have are skipped; other model names are the caller's to refuse.
void check_model_flags(const CLI::App& cmd, const std::string& model);
// Adds the GPT's shape flags (--preset --heads --d-model --seq-len --positions --vocab
// --remat --unit-scaled; --layers is the caller's, shared with the MLP).
void add_gpt_shape_options(CLI::App& cmd, train::ModelOptions& m);
// --save-dir, --save-every, --keep, --save-async, --resume, --init-from.
void add_checkpoint_options(CLI::App& cmd, train::CheckpointFlags& f);
// --quiet and --verbose on `cmd`, written into `level`.
void add_printing_flags(CLI::App& cmd, train::StepPrinting::Level& level);

}  // namespace strata::cli
