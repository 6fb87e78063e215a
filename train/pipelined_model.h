// What `strata train --pipeline-stages` (pipelined.h) trains: the GPT
// (models/gpt/pipeline_layers.h: embeddings, blocks, head) or the demo MLP
// (models/mlp_layers.h: one pipeline layer per MLP layer) as pipeline layers, built from the
// same flags and config the plain trainer reads, with what the pipelined trainer reports and
// saves of them.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/config.h"
#include "engine/stage_store.h"
#include "pipeline/executor.h"
#include "pipeline/model.h"
#include "train/model.h"

namespace strata::model {
class Fp8Products;
}

namespace strata::train {

struct PipelinedReplica {
  pipeline::PipelineModel model;
  std::shared_ptr<std::vector<double>> losses;  // each micro-batch's summed loss (the last stage writes them)
  // Validation (the GPT with a held-out part; empty otherwise): micro-batch v's input, and
  // the summed token loss of the last layer's output for it.
  std::function<void(int v, float* x)> val_input;
  std::function<double(int v, const float* y)> val_loss;
  // The GPT's FP8 products (models/gpt/pipeline_layers.h) with the config's fp8 block; null
  // otherwise.
  std::shared_ptr<model::Fp8Products> fp8;
};

struct NamedShape {
  std::string name;
  std::vector<std::int64_t> shape;
};

struct PipelinedModel {
  // Data-parallel replica d's layers, inputs and loss (the data of rank d of the replicas).
  std::function<PipelinedReplica(int d)> replica;
  int pipeline_layers = 0;
  // What a micro-batch's summed loss is over: its tokens (GPT) or samples (MLP); the
  // reported loss is the plain trainer's mean over them.
  std::uint64_t units_per_micro = 0;
  pipeline::Remat remat = pipeline::Remat::never;
  std::string describe;  // the banner's model part
  // What to change when `virtual_stages` cannot split the layers evenly.
  std::function<std::string(int virtual_stages)> split_hint;
  // The plain trainer's tensors in its order, and the ones pipeline layer `id`'s parameters
  // hold, in their order (a tied tail last: the store holds it at its owner).
  std::vector<NamedShape> tensors;
  std::function<std::vector<NamedShape>(int id)> layer_tensors;
  // The GPT's layers for one sequence of T tokens (rows T; the same ids and parameters), for
  // sampling, their FP8 scales (with fp8) the amax histories of `trained`, the replica's
  // products; empty for the MLP. vocab: the GPT's, seq_len its context.
  std::function<pipeline::PipelineModel(int T, const model::Fp8Products* trained)> at_length;
  int vocab = 0, seq_len = 0;
  // What --sample continues: the GPT's newline, the Llama's first data token (the plain
  // trainers' prompts).
  std::vector<std::int32_t> prompt{'\n'};
  // The model's own initial values (a Hugging Face directory's tensors), used when the run
  // neither resumes nor has --init-from; empty: each layer's init_params.
  engine::StageStore::LayerValues weights;
  // The model's own state for checkpoints (JSON text under the trainer state's "model", as
  // the plain trainer records it: a Hugging Face model's config.json; empty: none), and the
  // check a resume runs on a checkpoint's (gets "" when it holds none; throws naming what
  // does not match; null: none).
  std::string state;
  std::function<void(const std::string& saved)> check_state;
};

// The model --model names, for micro-batches of `micro_batch` (the config's
// train_micro_batch_size_per_gpu), `micro_batches` of them per step, over `replicas`
// data-parallel replicas; `quiet` keeps the text's load message off this rank. Throws
// Errc::invalid_argument naming the flag that cannot work (Errc::unsupported: FP8 or unit
// scaling for the MLP).
PipelinedModel pipelined_model(const ModelOptions& m, const engine::EngineConfig& config, int micro_batch,
                               int micro_batches, int replicas, bool quiet);

}  // namespace strata::train
