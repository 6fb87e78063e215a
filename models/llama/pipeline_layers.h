// A Llama-family decoder as pipeline layers (pipeline/layer.h), so `strata train --model DIR
// --pipeline-stages P` runs the model the plain trainer trains: layer 0 the token embedding,
// layers 1..L the blocks, layer L+1 the final RMSNorm and the LM head. The ids are the
// Llama's engine layers (config.h) and each layer's parameters are that engine layer's
// Hugging Face tensors concatenated in registration order (the head: model.norm.weight, then
// lm_head.weight, or for a tied model model.embed_tokens.weight again, lent by layer 0
// through PipelineModel::tie as the GPT's head reads its wte). Activations are fp32
// [B*T, hidden] for a micro-batch of B sequences of T tokens; the embedding's input is one
// float per token, its id (exact below 2^24), the head's output the logits [B*T, vocab].
// Compute is the Llama's own block (block.h: llama_block_forward and the split backward,
// llama_block_backward_input / _weight) and ops (ops.h), on the host device only
// (PipelineModel::bind is null), weight products in the precision the caller names. A block's
// saved buffer is its LlamaActs, then the LlamaSplit its B keeps for its W; B's temporaries
// (LlamaScratch) are the caller's work buffer (Layer::work_floats), which the stage counts in
// its device budget. The blocks split B from W, so every schedule runs, the Zero Bubble ones
// too; the head does not split (a tied head's gradient must leave in B: Tie), and
// the embedding splits (its B writes zeros: token ids have no gradient). Initial values are
// the engine's for the Llama's named tensors (engine::init_values, Hugging Face's
// initialisation), so a pipelined Llama with config.json alone starts where `strata train
// --model DIR` does for the same seed.
//
// Bits. The pipelined gradients are the plain trainer's bit for bit: the same calls on the
// same operands (the blocks' split backward gives the fused one's bits: block.h),
// micro-batches summed in order, and for a tied model the embedding's
// gradient as the plain pass forms it (llama::embedding_backward adds each token's summed
// rows onto the head's part: head + rows, the order in which the tie adds them).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "models/gpt/data.h"
#include "models/gpt/gemm.h"
#include "models/llama/config.h"
#include "pipeline/model.h"

namespace strata::model {

struct LlamaPipeline {
  pipeline::PipelineModel model;
  // Each micro-batch's sum of token losses, as the loss last saw it (written on the last
  // stage; read after the step).
  std::shared_ptr<std::vector<double>> losses;
  // Validation micro-batch v (the batcher's val_batch(v, micro_batch), the batches the
  // Llama's evaluate() reads): the embedding's input, and the sum of token losses of the
  // logits the head gave for it (for StageExecutor::forward_pass).
  std::function<void(int v, float* x)> val_input;
  std::function<double(int v, const float* logits)> val_loss;
};

// The Llama's pipeline model for micro-batches of `micro_batch` sequences of `seq_len`
// tokens (at most `train_seq_len`, the length the model trains at: 0 means it),
// `micro_batches` of them per step: inputs and targets from `batcher` as `strata train
// --model DIR` draws them for data-parallel rank `rank` of `world`; the gradient each
// micro-batch hands on is that of its mean token loss, as the Llama's pass hands the engine.
// `products`: the weight products' precision (bf16 operands with fp32 sums under bf16).
// Throws Errc::invalid_argument naming what cannot work.
LlamaPipeline llama_pipeline_model(const LlamaShape& shape, int train_seq_len, int micro_batch, int micro_batches,
                                   std::shared_ptr<const Batcher> batcher, int rank = 0, int world = 1,
                                   ops::Products products = ops::Products::fp32, int seq_len = 0);

// The parameters of pipeline layer `layer` in the order the layer reads them, as the
// Llama's named tensors (a tied head's embedding last).
std::vector<LlamaParam> llama_pipeline_params(const LlamaShape& shape, int layer);

}  // namespace strata::model
