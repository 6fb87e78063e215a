// A Llama-family decoder's shape, read from a Hugging Face config.json: Llama 2/3.x, Mistral,
// Qwen2/2.5 and Qwen3 (and the models that are Llamas: SmolLM2, TinyLlama). Blocks are
// pre-RMSNorm: x + o(attn(rope(q), rope(k), v)) over grouped-query attention, then
// + down(silu(gate(h)) * up(h)); a final RMSNorm and an LM head, tied to the token embedding
// or not. Parameters carry Hugging Face's names and shapes (linear weights [out, in], so
// y = x W^T + b), so a Hugging Face directory's tensors load as they are.
//
// Reading config.json: every key these model types define is used, or refused naming the key
// when it changes the arithmetic and is not implemented (MoE, an active sliding window,
// attention dropout, mlp_bias, rope_scaling types other than default/linear/llama3, a
// quantization_config). Keys outside these model types are listed in `unread_keys` for the
// caller to print. Errors are Errc::invalid_argument / Errc::unsupported naming the file and key.
//
// Engine layers: 0 holds model.embed_tokens, 1..L the blocks, L+1 model.norm (and lm_head
// when untied). A tied head reads layer 0 again, as the GPT does.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "engine/layout.h"

namespace strata::model {

struct RopeScaling {
  enum class Kind { none, linear, llama3 };
  Kind kind = Kind::none;
  double factor = 1.0;
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // llama3
  double original_max_positions = 8192;                  // llama3
};

struct LlamaShape {
  std::string model_type = "llama";  // llama, mistral, qwen2, qwen3
  int layers = 2;
  int hidden = 64;
  int intermediate = 128;
  int heads = 4;
  int kv_heads = 2;
  int head_dim = 16;
  int vocab = 256;
  int max_positions = 2048;
  double rms_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope;
  double initializer_range = 0.02;
  bool qkv_bias = false;                 // q/k/v projections have biases (Qwen2; Llama/Qwen3 attention_bias)
  bool o_bias = false;                   // o_proj has a bias (Llama/Qwen3 attention_bias)
  bool qk_norm = false;                  // per-head RMSNorm of q and k before the rotation (Qwen3)
  bool tied = false;                     // lm_head is embed_tokens
  int sliding_window = 0;                // > 0: attention sees at most this many positions (refused when it bites)
  std::vector<std::string> unread_keys;  // keys outside these model types (not read)
};

// The shape config.json at `path` describes (the json already parsed).
LlamaShape parse_hf_config(const nlohmann::json& config, const std::string& path);
// Throws naming the key when training at `seq_len` would need what is not implemented (an
// active sliding window) or runs past max_position_embeddings.
void validate_seq_len(const LlamaShape& s, int seq_len);

// Which parameter of a block a slot is (registration order; the optional ones are present
// per the shape: llama_block_slots()).
enum LlamaSlot {
  in_norm,
  q_w,
  q_b,
  k_w,
  k_b,
  v_w,
  v_b,
  o_w,
  o_b,
  q_norm,
  k_norm,
  post_norm,
  gate_w,
  up_w,
  down_w,
  kLlamaSlots
};
std::vector<LlamaSlot> llama_block_slots(const LlamaShape& s);

struct LlamaParam {
  std::string name;
  std::vector<std::int64_t> shape;
  int layer = 0;
  engine::ParamInit init;
};
// Every parameter in registration order: model.embed_tokens.weight, each block's in slot
// order, model.norm.weight, then lm_head.weight when untied. Initial values are Hugging
// Face's: linear weights and the embedding N(0, initializer_range), norms one, biases zero.
std::vector<LlamaParam> llama_params(const LlamaShape& s);
std::uint64_t llama_parameter_count(const LlamaShape& s);
// Model FLOPs of one training token: 6 per weight of every product (the head included) plus
// the attention products over the full T x T square (12 x layers x seq_len x heads x head_dim).
double llama_train_flops_per_token(const LlamaShape& s, int seq_len);
// The rotation's inverse frequencies (head_dim / 2 of them) per rope_theta and rope_scaling,
// in double as Hugging Face defines them.
std::vector<double> rope_inv_freq(const LlamaShape& s);
// One line: type, layers x hidden, heads/kv heads, head_dim, vocab, parameters.
std::string describe(const LlamaShape& s);

}  // namespace strata::model
