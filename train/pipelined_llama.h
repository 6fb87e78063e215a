// `strata train --model DIR --pipeline-stages P`: a Llama-family decoder from a Hugging Face
// model directory (llama.h) as the pipelined trainer's model (pipelined_model.h),
// its layers models/llama/pipeline_layers.h. Built from the flags and config the plain
// trainer reads (--seq-len, --remat, --data, the config's micro-batch and precision); the
// weights are the directory's: the directory is opened and checked (every tensor the model
// registers, with its shape; a tied head's copy and rotary tables tolerated) when the model
// is built, and each stage then reads its own layers' tensors (PipelinedModel::weights, one
// HfModelDir per call: stages call it from their own threads at once). With config.json
// alone the stages start from Hugging Face's initialisation (the engine's initial values of
// the named tensors, as the plain trainer's). Sampling starts from the data's first token,
// as the plain trainer's does. Checkpoints record config.json as the plain trainer's do, and a
// resume refuses one of another architecture. Every schedule runs, the zero-bubble ones
// too: the blocks split their backward into B and W (models/llama/block.h).
#pragma once

#include "engine/config.h"
#include "train/model.h"
#include "train/pipelined_model.h"

namespace strata::train {

// The decoder --model DIR describes, for micro-batches of `micro_batch` sequences,
// `micro_batches` of them per step, over `replicas` data-parallel replicas; `quiet` keeps
// the load messages off this rank. Throws naming the file, key or tensor that cannot work.
PipelinedModel llama_pipelined_model(const ModelOptions& o, const engine::EngineConfig& config, int micro_batch,
                                     int micro_batches, int replicas, bool quiet);

}  // namespace strata::train
