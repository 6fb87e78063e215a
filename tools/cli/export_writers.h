// The two outputs of `strata export`: one safetensors file, or a Hugging Face model directory
// (models/hf/). Both are fed by stream_masters(), which reads a checkpoint's fp32 masters
// tensor by tensor in pieces of at most 1M elements (chunks verified against their checksums)
// and hands each piece to the writer, so memory stays a few fixed buffers whatever the model.
// It stops with an error at the next piece once an interrupt arrived (the caller holds an
// InterruptScope, interrupt.h); the writer's destructor then removes its OUT.tmp.
//
// The Hugging Face directory needs the model's config.json: `strata train` records it, for a
// model that has one (the Llama family loaded from a Hugging Face directory), as the key
// "hf_config" of the model's state (TrainModel::state()), which the checkpoint keeps as
// "model" in its trainer state (manifest.trainer_state, train/checkpoints.cc).
// hf_config_text() reads it back; export_hf() takes the text as a parameter.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "checkpoint/format.h"
#include "runtime/core/dtype.h"

namespace strata::cli {

// Feeds `sink` every tensor's master values in the manifest's order; `out` names the output
// in the interrupt message.
void stream_masters(const std::string& step_dir, const checkpoint::Manifest& m, const std::string& out,
                    const std::function<void(const float*, std::uint64_t)>& sink);

// config.json's text from the checkpoint's trainer state. Throws Errc::invalid_argument
// naming `checkpoint` (the --checkpoint given) when the checkpoint records none, saying that
// --format safetensors exports it; Errc::corrupt when the record is not a JSON object.
std::string hf_config_text(const checkpoint::Manifest& m, const std::string& checkpoint);

// The checkpoint in `step_dir` as a Hugging Face directory `out` (absent or empty; see
// model::HfDirWriter), with `config_text` as its config.json; returns the weight files.
std::vector<std::string> export_hf(const std::string& step_dir, const checkpoint::Manifest& m, const std::string& out,
                                   DType dtype, std::uint64_t max_shard_bytes, const std::string& config_text);

}  // namespace strata::cli
