// The GPT's shape: a GPT-2-style decoder (token and position embeddings, pre-LayerNorm
// blocks of causal multi-head self-attention and a tanh-GELU MLP, a final LayerNorm, an LM
// head tied to the token embedding), by preset or by dimension, and the parameters it
// registers with the engine. Names and shapes are Hugging Face's GPT-2 ones (Conv1D
// weights stored [in, out], so y = x W + b), so Strata's safetensors load into a GPT-2.
//
// Engine layers: 0 holds the embeddings (wte, wpe), 1..L the blocks (one block = one engine
// layer, gathered, reduced, paged and stepped as a unit), L+1 the final LayerNorm. The LM
// head reads wte again, so layer 0 is gathered twice in a forward pass.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/layout.h"
#include "models/gpt/fp8.h"

namespace strata::model {

enum class Remat { never, except_last, always };

struct GptShape {
  int layers = 4;
  int heads = 4;
  int d_model = 128;
  int positions = 128;  // rows of the position table (wpe): the longest sequence the model takes
  int vocab = 256;
};

struct GptConfig {
  GptShape shape;
  int seq_len = 128;  // training sequence length, <= shape.positions
  // Re-materialization per block: never keeps every block's activations; always keeps only
  // each block's input and recomputes the block in backward; except_last recomputes every
  // block but the last, whose backward follows its forward at once.
  Remat remat = Remat::never;
  std::uint64_t seed = 0;    // data order (initial values come from the engine's seed)
  fp8::Recipe fp8;           // FP8 operands for the matrix products (fp8.h); off by default
  bool unit_scaled = false;  // unit scaling (unit_scale.h): weights at unit scale, scaled ops
};

// Presets: tiny (4 x 128, 4 heads, 256 positions), 124M, 350M, 774M, 1.5B (GPT-2's; 1024
// positions, vocabulary 50257). Throws Errc::invalid_argument naming the preset.
GptShape gpt_preset(const std::string& name);
Remat parse_remat(const std::string& s);
// How a pass keeps activations under `r` for `layers` blocks: how many sets of one block's
// activations it allocates, which set block `block` uses, and whether backward recomputes it.
int remat_act_sets(Remat r, int layers) noexcept;

// Rows of logits a pass's head (the GPT's, the Llama's) holds at once: on the host, chunks of
// about 4 Mi logits, the loss and the head's gradients taken chunk by chunk (a 50,257-entry
// vocabulary at 1,024 tokens holds 16 MiB of logits instead of 206; 128,256 entries, 16 instead
// of 525), never fewer than max_batch (a forward-only head writes one row per sequence);
// whole: all tokens in one product (a CUDA device, FP8's delayed scaling).
std::size_t head_chunk_rows(std::size_t tokens, int max_batch, int vocab, bool whole) noexcept;
int remat_act_set(Remat r, int block, int layers) noexcept;
bool remat_recomputes(Remat r, int block, int layers) noexcept;
const char* remat_name(Remat r) noexcept;
// Throws Errc::invalid_argument naming the flag for a shape or length that cannot work.
void validate(const GptConfig& c);

struct GptParam {
  std::string name;
  std::vector<std::int64_t> shape;
  int layer = 0;
  engine::ParamInit init;
  float lr_scale = 1.0f;  // the engine's per-parameter learning-rate multiplier
};
// Every parameter in registration order: layer 0, then each block, then ln_f. Within a
// block the order is ln_1.{weight,bias}, attn.c_attn.{weight,bias}, attn.c_proj.{weight,bias},
// ln_2.{weight,bias}, mlp.c_fc.{weight,bias}, mlp.c_proj.{weight,bias} (block_param indices).
// Unit-scaled: matrices and embeddings N(0,1), each stepping at lr / the fixed scale it computes
// with (unit_scale.h), which for the attention projection depends on the training seq_len
// (0: the position table's length).
std::vector<GptParam> gpt_params(const GptShape& s, bool unit_scaled = false, int seq_len = 0);
std::uint64_t gpt_parameter_count(const GptShape& s);
// Model FLOPs of one training token (forward and backward, re-materialization not counted):
// 6 per weight of every matrix product (the blocks' four and the tied head) plus the
// attention products, 12 x layers x seq_len x d_model (scores and values over the full
// T x T square, as the usual MFU accounting does).
double gpt_train_flops_per_token(const GptShape& s, int seq_len);

enum BlockParam {
  ln1_w,
  ln1_b,
  qkv_w,
  qkv_b,
  attproj_w,
  attproj_b,
  ln2_w,
  ln2_b,
  fc_w,
  fc_b,
  fcproj_w,
  fcproj_b,
  kBlockParams
};

}  // namespace strata::model
