// `strata train --model DIR`: a Llama-family decoder from a Hugging Face model directory
// (config.json, and model.safetensors or its shards; models/hf/model_dir.h), behind
// TrainModel. The architecture comes from config.json (models/llama/config.h); after
// engine.setup() the weights are read straight into each rank's partitions on their tiers
// (engine.init_weights: every rank reads only the byte ranges it owns), or, with config.json
// alone, the run starts from Hugging Face's initialisation. The checkpoint's model state
// records config.json ("hf_config"), which `strata export --format hf` writes back out, and a
// resumed run refuses a checkpoint of another architecture.
#pragma once

#include <memory>
#include <string>

#include "models/gpt/config.h"
#include "models/llama/llama.h"
#include "train/model.h"

namespace strata::train {

// DIR is a Hugging Face model directory (a directory holding config.json).
bool is_hf_model_dir(const std::string& path);
// The decoder --model DIR describes, at --seq-len (default min(max_position_embeddings, 2048))
// and --remat; throws naming the file and key for what is not implemented.
model::LlamaConfig llama_config(const ModelOptions& o, bool config_remat);
// Throws Errc::invalid_argument unless the model state `text` of a checkpoint (JSON: its
// "hf_config") describes the architecture `shape` (read from --model `dir`): the same
// tensors, norm epsilon and rotary frequencies.
void check_llama_state(const std::string& text, const model::LlamaShape& shape, const std::string& dir);
ModelSize llama_model_size(const ModelOptions& o, const engine::EngineConfig& config, bool cuda = false);
std::unique_ptr<TrainModel> create_llama_model(const ModelOptions& o, engine::Engine& engine, comm::Communicator* comm,
                                               Tracer* tracer);

}  // namespace strata::train
