// config.json to LlamaShape (see config.h): which keys each model type defines, what each
// one does here, and the parameters the shape registers.
#include "models/llama/config.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "runtime/core/error.h"

namespace strata::model {
namespace {

using nlohmann::json;

// Keys every Hugging Face config may carry that do not change the arithmetic of training.
const std::set<std::string>& no_effect_keys() {
  static const std::set<std::string> keys = {"architectures",
                                             "model_type",
                                             "torch_dtype",
                                             "dtype",
                                             "transformers_version",
                                             "_name_or_path",
                                             "bos_token_id",
                                             "eos_token_id",
                                             "pad_token_id",
                                             "use_cache",
                                             "return_dict",
                                             "output_hidden_states",
                                             "output_attentions",
                                             "torchscript",
                                             "is_decoder",
                                             "is_encoder_decoder",
                                             "tokenizer_class",
                                             "auto_map",
                                             "max_window_layers",
                                             "bos_token",
                                             "eos_token",
                                             "pad_token",
                                             "id2label",
                                             "label2id",
                                             "problem_type",
                                             "finetuning_task",
                                             "task_specific_params",
                                             "chunk_size_feed_forward",
                                             "tie_encoder_decoder",
                                             "prefix",
                                             "sep_token_id",
                                             "decoder_start_token_id",
                                             "use_bfloat16",
                                             "_attn_implementation_autoset",
                                             "initializer_range",
                                             "max_position_embeddings"};
  return keys;
}

// Keys that belong to mixtures of experts or quantized checkpoints: another model.
const std::set<std::string>& refused_keys() {
  static const std::set<std::string> keys = {"num_experts",
                                             "num_local_experts",
                                             "num_experts_per_tok",
                                             "moe_intermediate_size",
                                             "shared_expert_intermediate_size",
                                             "decoder_sparse_step",
                                             "mlp_only_layers",
                                             "quantization_config",
                                             "router_aux_loss_coef",
                                             "output_router_logits"};
  return keys;
}

template <class T> T get(const json& c, const char* key, const std::string& path) {
  try {
    return c.at(key).get<T>();
  } catch (const json::exception&) {
    STRATA_THROW(Errc::invalid_argument, path, ": key '", key, "' is ",
                 c.contains(key) ? "not " : "missing; it should be ",
                 std::is_same_v<T, std::string> ? "a string" : (std::is_same_v<T, bool> ? "a boolean" : "a number"),
                 ": fix config.json");
  }
}

template <class T> T get_or(const json& c, const char* key, T fallback, const std::string& path) {
  if (!c.contains(key) || c.at(key).is_null()) return fallback;
  return get<T>(c, key, path);
}

RopeScaling parse_rope(const json& r, const std::string& path, const char* key) {
  RopeScaling out;
  if (r.is_null()) return out;
  STRATA_CHECK(r.is_object(), Errc::invalid_argument, path, ": '", key, "' must be an object or null");
  std::string type = r.contains("rope_type") ? get<std::string>(r, "rope_type", path)
                                             : get_or<std::string>(r, "type", "default", path);
  if (type == "default") return out;
  if (type == "linear") {
    out.kind = RopeScaling::Kind::linear;
  } else if (type == "llama3") {
    out.kind = RopeScaling::Kind::llama3;
    out.low_freq_factor = get<double>(r, "low_freq_factor", path);
    out.high_freq_factor = get<double>(r, "high_freq_factor", path);
    out.original_max_positions = get<double>(r, "original_max_position_embeddings", path);
    STRATA_CHECK(out.high_freq_factor > out.low_freq_factor, Errc::invalid_argument, path, ": ", key,
                 ".high_freq_factor must exceed low_freq_factor");
  } else {
    STRATA_THROW(Errc::unsupported, path, ": ", key, " type '", type,
                 "' is not implemented (default, linear and llama3 are): it changes the rotary arithmetic");
  }
  out.factor = get<double>(r, "factor", path);
  STRATA_CHECK(out.factor > 0, Errc::invalid_argument, path, ": ", key, ".factor must be > 0");
  return out;
}

void check_positive(int v, const char* key, const std::string& path) {
  STRATA_CHECK(v >= 1, Errc::invalid_argument, path, ": '", key, "' is ", v, "; it must be >= 1");
}

}  // namespace

LlamaShape parse_hf_config(const json& c, const std::string& path) {
  STRATA_CHECK(c.is_object(), Errc::invalid_argument, path, ": config.json must be a JSON object");
  LlamaShape s;
  s.model_type = get<std::string>(c, "model_type", path);
  const std::string& t = s.model_type;
  STRATA_CHECK(t == "llama" || t == "mistral" || t == "qwen2" || t == "qwen3", Errc::unsupported, path,
               ": model_type '", t,
               "' is not implemented: Strata reads llama, mistral, qwen2 and qwen3 decoders (mixtures of experts "
               "and other architectures are not)");
  std::set<std::string> used = {"vocab_size",        "hidden_size",         "intermediate_size",
                                "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                                "head_dim",          "rms_norm_eps",        "rope_theta",
                                "rope_scaling",      "rope_parameters",     "tie_word_embeddings",
                                "hidden_act",        "attention_dropout",   "layer_types"};
  s.vocab = get<int>(c, "vocab_size", path);
  s.hidden = get<int>(c, "hidden_size", path);
  s.intermediate = get<int>(c, "intermediate_size", path);
  s.layers = get<int>(c, "num_hidden_layers", path);
  s.heads = get<int>(c, "num_attention_heads", path);
  for (auto [v, k] : {std::pair{s.vocab, "vocab_size"},
                      {s.hidden, "hidden_size"},
                      {s.intermediate, "intermediate_size"},
                      {s.layers, "num_hidden_layers"},
                      {s.heads, "num_attention_heads"}})
    check_positive(v, k, path);
  s.kv_heads = get_or<int>(c, "num_key_value_heads", s.heads, path);
  check_positive(s.kv_heads, "num_key_value_heads", path);
  STRATA_CHECK(s.heads % s.kv_heads == 0, Errc::invalid_argument, path, ": num_attention_heads ", s.heads,
               " is not a multiple of num_key_value_heads ", s.kv_heads);
  STRATA_CHECK(t == "qwen3" || c.contains("head_dim") || s.hidden % s.heads == 0, Errc::invalid_argument, path,
               ": hidden_size ", s.hidden, " is not a multiple of num_attention_heads ", s.heads,
               " and there is no head_dim");
  s.head_dim = get_or<int>(c, "head_dim", s.hidden / s.heads, path);
  check_positive(s.head_dim, "head_dim", path);
  STRATA_CHECK(s.head_dim % 2 == 0, Errc::invalid_argument, path, ": head_dim ", s.head_dim,
               " must be even (the rotation pairs halves)");
  s.max_positions = get_or<int>(c, "max_position_embeddings", 2048, path);
  s.initializer_range = get_or<double>(c, "initializer_range", 0.02, path);
  s.rms_eps = get_or<double>(c, "rms_norm_eps", 1e-6, path);
  s.rope_theta = get_or<double>(c, "rope_theta", 10000.0, path);
  s.tied = get_or<bool>(c, "tie_word_embeddings", false, path);
  if (c.contains("rope_parameters") && c.at("rope_parameters").is_object()) {
    const json& rp = c.at("rope_parameters");
    s.rope = parse_rope(rp, path, "rope_parameters");
    s.rope_theta = get_or<double>(rp, "rope_theta", s.rope_theta, path);
  } else if (c.contains("rope_scaling")) {
    s.rope = parse_rope(c.at("rope_scaling"), path, "rope_scaling");
  }
  const std::string act = get_or<std::string>(c, "hidden_act", "silu", path);
  STRATA_CHECK(act == "silu", Errc::unsupported, path, ": hidden_act '", act,
               "' is not implemented (the SwiGLU MLP takes silu)");
  STRATA_CHECK(get_or<double>(c, "attention_dropout", 0.0, path) == 0.0, Errc::unsupported, path,
               ": attention_dropout is not implemented: set it to 0.0 (fine-tuning recipes do)");
  if (t == "llama") {
    used.insert({"attention_bias", "mlp_bias", "pretraining_tp"});
    s.qkv_bias = s.o_bias = get_or<bool>(c, "attention_bias", false, path);
    STRATA_CHECK(!get_or<bool>(c, "mlp_bias", false, path), Errc::unsupported, path,
                 ": mlp_bias true is not implemented (biases on gate/up/down projections)");
    STRATA_CHECK(get_or<int>(c, "pretraining_tp", 1, path) == 1, Errc::unsupported, path,
                 ": pretraining_tp other than 1 (sliced projections) is not implemented: set it to 1, the same "
                 "function up to rounding");
  } else if (t == "mistral") {
    used.insert("sliding_window");
    s.sliding_window = get_or<int>(c, "sliding_window", 0, path);
  } else {
    used.insert({"use_sliding_window", "sliding_window"});
    if (get_or<bool>(c, "use_sliding_window", false, path))
      s.sliding_window = get_or<int>(c, "sliding_window", 0, path);
    s.qkv_bias = t == "qwen2";
    if (t == "qwen3") {
      used.insert("attention_bias");
      s.qkv_bias = s.o_bias = get_or<bool>(c, "attention_bias", false, path);
      s.qk_norm = true;
    }
  }
  if (c.contains("layer_types") && c.at("layer_types").is_array()) {
    for (const auto& lt : c.at("layer_types")) {
      STRATA_CHECK(lt == "full_attention" || (lt == "sliding_attention" && s.sliding_window == 0), Errc::unsupported,
                   path, ": layer_types holds ", lt.dump(), ": only full attention is implemented");
    }
  }
  for (const auto& [key, value] : c.items()) {
    STRATA_CHECK(refused_keys().count(key) == 0, Errc::unsupported, path, ": key '", key,
                 "' belongs to a mixture of experts or a quantized checkpoint, which is not implemented");
    if (used.count(key) == 0 && no_effect_keys().count(key) == 0) s.unread_keys.push_back(key);
  }
  return s;
}

void validate_seq_len(const LlamaShape& s, int seq_len) {
  STRATA_CHECK(seq_len >= 1, Errc::invalid_argument, "--seq-len ", seq_len, " must be >= 1");
  STRATA_CHECK(s.sliding_window == 0 || seq_len <= s.sliding_window, Errc::unsupported, "--seq-len ", seq_len,
               " is longer than the model's sliding_window ", s.sliding_window,
               ": windowed attention is not implemented, so train with --seq-len <= ", s.sliding_window);
  STRATA_CHECK(seq_len <= s.max_positions, Errc::invalid_argument, "--seq-len ", seq_len,
               " is above the model's max_position_embeddings ", s.max_positions);
}

std::vector<LlamaSlot> llama_block_slots(const LlamaShape& s) {
  std::vector<LlamaSlot> out{in_norm, q_w};
  if (s.qkv_bias) out.push_back(q_b);
  out.push_back(k_w);
  if (s.qkv_bias) out.push_back(k_b);
  out.push_back(v_w);
  if (s.qkv_bias) out.push_back(v_b);
  out.push_back(o_w);
  if (s.o_bias) out.push_back(o_b);
  if (s.qk_norm) {
    out.push_back(q_norm);
    out.push_back(k_norm);
  }
  for (LlamaSlot x : {post_norm, gate_w, up_w, down_w}) out.push_back(x);
  return out;
}

std::vector<LlamaParam> llama_params(const LlamaShape& s) {
  const std::int64_t C = s.hidden, V = s.vocab, I = s.intermediate, D = s.head_dim;
  const std::int64_t Q = s.heads * D, KV = s.kv_heads * D;
  const engine::ParamInit ones{engine::InitKind::ones, 0.0f}, zeros{engine::InitKind::zeros, 0.0f};
  const engine::ParamInit w{engine::InitKind::normal, static_cast<float>(s.initializer_range)};
  std::vector<LlamaParam> out;
  out.push_back({"model.embed_tokens.weight", {V, C}, 0, w});
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const int layer = l + 1;
    for (LlamaSlot x : llama_block_slots(s)) {
      switch (x) {
        case in_norm:
          out.push_back({p + "input_layernorm.weight", {C}, layer, ones});
          break;
        case q_w:
          out.push_back({p + "self_attn.q_proj.weight", {Q, C}, layer, w});
          break;
        case q_b:
          out.push_back({p + "self_attn.q_proj.bias", {Q}, layer, zeros});
          break;
        case k_w:
          out.push_back({p + "self_attn.k_proj.weight", {KV, C}, layer, w});
          break;
        case k_b:
          out.push_back({p + "self_attn.k_proj.bias", {KV}, layer, zeros});
          break;
        case v_w:
          out.push_back({p + "self_attn.v_proj.weight", {KV, C}, layer, w});
          break;
        case v_b:
          out.push_back({p + "self_attn.v_proj.bias", {KV}, layer, zeros});
          break;
        case o_w:
          out.push_back({p + "self_attn.o_proj.weight", {C, Q}, layer, w});
          break;
        case o_b:
          out.push_back({p + "self_attn.o_proj.bias", {C}, layer, zeros});
          break;
        case q_norm:
          out.push_back({p + "self_attn.q_norm.weight", {D}, layer, ones});
          break;
        case k_norm:
          out.push_back({p + "self_attn.k_norm.weight", {D}, layer, ones});
          break;
        case post_norm:
          out.push_back({p + "post_attention_layernorm.weight", {C}, layer, ones});
          break;
        case gate_w:
          out.push_back({p + "mlp.gate_proj.weight", {I, C}, layer, w});
          break;
        case up_w:
          out.push_back({p + "mlp.up_proj.weight", {I, C}, layer, w});
          break;
        case down_w:
          out.push_back({p + "mlp.down_proj.weight", {C, I}, layer, w});
          break;
        case kLlamaSlots:
          break;
      }
    }
  }
  out.push_back({"model.norm.weight", {C}, s.layers + 1, ones});
  if (!s.tied) out.push_back({"lm_head.weight", {V, C}, s.layers + 1, w});
  return out;
}

std::uint64_t llama_parameter_count(const LlamaShape& s) {
  std::uint64_t n = 0;
  for (const auto& p : llama_params(s)) {
    std::uint64_t e = 1;
    for (auto d : p.shape) e *= static_cast<std::uint64_t>(d);
    n += e;
  }
  return n;
}

double llama_train_flops_per_token(const LlamaShape& s, int seq_len) {
  const double C = s.hidden, D = s.head_dim, Q = s.heads * D, KV = s.kv_heads * D, I = s.intermediate;
  const double per_block = C * Q * 2 + C * KV * 2 + 3 * C * I;
  const double weights = s.layers * per_block + static_cast<double>(s.vocab) * C;
  return 6.0 * weights + 12.0 * s.layers * seq_len * Q;
}

std::vector<double> rope_inv_freq(const LlamaShape& s) {
  const int half = s.head_dim / 2;
  std::vector<double> f(static_cast<std::size_t>(half));
  const double pi = std::acos(-1.0);
  for (int i = 0; i < half; ++i) {
    double inv = 1.0 / std::pow(s.rope_theta, (2.0 * i) / s.head_dim);
    const auto& r = s.rope;
    if (r.kind == RopeScaling::Kind::linear) {
      inv /= r.factor;
    } else if (r.kind == RopeScaling::Kind::llama3) {
      const double wavelen = 2 * pi / inv;
      const double low_wavelen = r.original_max_positions / r.low_freq_factor;
      const double high_wavelen = r.original_max_positions / r.high_freq_factor;
      if (wavelen > low_wavelen) {
        inv /= r.factor;
      } else if (wavelen >= high_wavelen) {
        const double smooth =
            (r.original_max_positions / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
        inv = (1 - smooth) * inv / r.factor + smooth * inv;
      }
    }
    f[static_cast<std::size_t>(i)] = inv;
  }
  return f;
}

std::string describe(const LlamaShape& s) {
  return str_cat(s.model_type, " ", s.layers, " layers x ", s.hidden, " (", s.heads, " heads, ", s.kv_heads,
                 " kv heads, head_dim ", s.head_dim, ", mlp ", s.intermediate, ", vocab ", s.vocab,
                 s.tied ? ", tied head" : "", "; ", llama_parameter_count(s), " parameters)");
}

}  // namespace strata::model
