// The GPT as pipeline layers (pipeline/layer.h), so the executor runs the model `strata
// train` trains: layer 0 the embeddings, layers 1..L the blocks, layer L+1 the final
// LayerNorm and the LM head, whose weight is layer 0's token embedding
// (PipelineModel::tie). The ids are the GPT's engine layers (config.h) and each layer's
// parameters are that engine layer's tensors concatenated in registration order (the head:
// ln_f.weight, ln_f.bias, then the tied wte). Activations are fp32 [B*T, C] for a
// micro-batch of B sequences of T tokens; the embedding's input is one float per token, its
// id (exact below 2^24), and the head's output the logits [B*T, vocab]. Compute is the
// GPT's own code (block.h) through the kernels object its trainer uses (kernels.h) in fp32:
// the host kernels (oneDNN products, TBB loops), or, bound to a CUDA stage's stream
// (PipelineModel::bind), CUDA kernels of that stage's own; its weight products in the
// precision the caller names; a unit-scaled GPT (GptConfig::unit_scaled) carries
// unit_scale.h's scales in every layer and the loss. With the config's fp8 block the weight
// products take FP8 operands (fp8_products.h): one Fp8Products for the model's layers,
// whose delayed-scaling state the caller steps (GptPipeline::fp8); a model with it serves
// one stage's thread. A layer's scratch (the FP8 operands, the head's gradient at ln_f's
// output, the unit-scaled embedding's scaled gradient) is the caller's work buffer
// (Layer::work_floats), so a stage counts it in its device budget (a CUDA stage's kernels
// keep theirs, cuda_scratch_bytes, on the stage's scratch device: PipelineModel::bind_bytes,
// which a stage on a ZeRO engine reserves). The layers name their tensors (Layer::tensors)
// with the learning-rate scales the GPT registers. The blocks split B and W
// (block_backward_input / _weight), the embedding too (its B writes zeros: token ids have
// no gradient); the head does not split (it reads the tie). Initial values are the
// engine's for the GPT's named tensors (engine::init_values), so a pipelined GPT starts
// from the weights `strata train` gives it with the same seed.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "models/gpt/config.h"
#include "models/gpt/data.h"
#include "models/gpt/gemm.h"
#include "pipeline/model.h"

namespace strata::model {

class Fp8Products;

struct GptPipeline {
  pipeline::PipelineModel model;
  // Each micro-batch's sum of token losses, as the loss last saw it (written on the last
  // stage; read after the step).
  std::shared_ptr<std::vector<double>> losses;
  // Validation micro-batch v (the batcher's val_batch(v, micro_batch), the batches the
  // GPT's evaluate() reads): the embedding's input, and the sum of token losses of the
  // logits the head gave for it (for StageExecutor::forward_pass).
  std::function<void(int v, float* x)> val_input;
  std::function<double(int v, const float* logits)> val_loss;
  // With the config's fp8 block: the layers' FP8 products (null otherwise). The caller turns
  // recording on for training steps only, and after each optimizer step reduces step_amax()
  // (max) over the data-parallel replicas of the layers it ran and calls end_step(), as the
  // GPT's trainer does; layers it did not run leave their sites' amax unused.
  std::shared_ptr<Fp8Products> fp8;
};

// The GPT's pipeline model for micro-batches of `micro_batch` sequences, `micro_batches` of
// them per step: inputs and targets from `batcher` as `strata train` draws them for
// data-parallel rank `rank` of `world`; the gradient each micro-batch hands on is that of
// its mean token loss, as the GPT's pass hands the engine (which averages over the
// micro-batches and ranks of a step). Throws Errc::invalid_argument naming what cannot work (a shape validate()
// refuses).
// `products`: the precision of the weight products, as the GPT's pass takes it for the
// compute dtype (bf16 operands with fp32 sums under bf16). `seq_len`: tokens per sequence
// of the micro-batches when fewer than the config's (sampling: the model trained at
// config.seq_len, whose unit scales that length fixes); 0: config.seq_len.
GptPipeline gpt_pipeline_model(const GptConfig& config, int micro_batch, int micro_batches,
                               std::shared_ptr<const Batcher> batcher, int rank = 0, int world = 1,
                               ops::Products products = ops::Products::fp32, int seq_len = 0);

// The parameters of pipeline layer `layer` in the order the layer reads them, as the GPT's
// named tensors (for export and for checking against the GPT itself); unit-scaled, with
// gpt_params' initialisation and learning-rate scales for training length `seq_len`.
std::vector<GptParam> gpt_pipeline_params(const GptShape& shape, int layer, bool unit_scaled = false, int seq_len = 0);

}  // namespace strata::model
