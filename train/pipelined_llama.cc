// A Hugging Face Llama-family directory as the pipelined trainer's model (see
// pipelined_llama.h).
#include "train/pipelined_llama.h"

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "models/gpt/data.h"
#include "models/hf/model_dir.h"
#include "models/llama/pipeline_layers.h"
#include "runtime/core/error.h"
#include "train/llama.h"

namespace strata::train {
namespace {

// Tensors a Hugging Face checkpoint may carry that the model does not read (as the plain
// trainer tolerates them): a tied head's copy of the embedding, older Llamas' rotary tables.
bool tolerated_extra(const model::LlamaShape& s, const std::string& name) {
  const std::string inv = "rotary_emb.inv_freq";
  return (s.tied && name == "lm_head.weight") ||
         (name.size() > inv.size() && name.compare(name.size() - inv.size(), inv.size(), inv) == 0);
}

// Checks the directory's tensors against the model's (once, before any stage starts) and
// returns what writes a pipeline layer's parameters from them; empty with config.json alone.
engine::StageStore::LayerValues hf_weights(const std::string& dir, const model::LlamaShape& s, bool quiet) {
  model::HfModelDir hf(dir);
  if (!hf.has_weights()) {
    if (!quiet)
      std::printf("%s has config.json alone: starting from Hugging Face's initialisation (normal(0, %g), norms 1)\n",
                  dir.c_str(), s.initializer_range);
    return {};
  }
  model::hf::WantedTensors wanted;
  for (const auto& p : model::llama_params(s)) wanted.emplace_back(p.name, p.shape);
  for (const auto& t : hf.tensors())
    if (tolerated_extra(s, t.name)) wanted.emplace_back(t.name, t.shape);
  hf.check(wanted);
  if (!quiet)
    std::printf("reading %zu tensors from %s (%zu shard file%s): each stage reads its own layers'\n",
                model::llama_params(s).size(), dir.c_str(), hf.shard_files().size(),
                hf.shard_files().size() == 1 ? "" : "s");
  return [dir, s](int layer, std::size_t count, float* out) {
    model::HfModelDir file(dir);
    std::size_t at = 0;
    for (const auto& p : model::llama_pipeline_params(s, layer)) {
      if (at == count) break;  // a tied tail: its owner's
      std::size_t n = 1;
      for (auto e : p.shape) n *= static_cast<std::size_t>(e);
      STRATA_CHECK(at + n <= count, Errc::internal, "pipeline layer ", layer, " holds ", count,
                   " parameters, fewer than its tensors need");
      file.read(p.name, 0, n, out + at);
      for (std::size_t i = 0; i < n; ++i) {
        STRATA_CHECK(std::isfinite(out[at + i]), Errc::invalid_argument, "'", dir, "': tensor '", p.name, "' holds ",
                     out[at + i], " at element ", i,
                     ": training cannot start from non-finite weights; fix or re-export the checkpoint");
      }
      at += n;
    }
    STRATA_CHECK(at == count, Errc::internal, "pipeline layer ", layer, " holds ", count, " parameters, and its ",
                 "tensors give ", at);
  };
}

template <typename Spec> std::vector<NamedShape> named(const std::vector<Spec>& specs) {
  std::vector<NamedShape> out;
  for (const auto& p : specs) out.push_back({p.name, p.shape});
  return out;
}

}  // namespace

PipelinedModel llama_pipelined_model(const ModelOptions& o, const engine::EngineConfig& cfg, int B, int m, int D,
                                     bool quiet) {
  STRATA_CHECK(!o.data.empty(), Errc::invalid_argument, "--model ", o.model,
               " needs --data PATH: a token file in the model's vocabulary (strata tokenize writes one)");
  STRATA_CHECK(o.eval_every == 0 || o.val_fraction > 0, Errc::invalid_argument,
               "--eval-every needs a validation split: set --val-fraction > 0");
  check_no_fp8(cfg);
  const model::LlamaConfig c = llama_config(o, config_remat(cfg));
  const model::LlamaShape& s = c.shape;
  if (!quiet && !s.unread_keys.empty()) {
    std::string keys;
    for (const auto& k : s.unread_keys) keys += (keys.empty() ? "" : ", ") + k;
    std::printf("note: %s/config.json: keys not read (outside the %s architecture): %s\n", o.model.c_str(),
                s.model_type.c_str(), keys.c_str());
  }
  const auto batcher = model::load_batcher(o.data, s.vocab, o.data_format, c.seq_len, o.val_fraction, o.seed, quiet);
  const auto products = model::ops::products_for(engine::compute_dtype_of(cfg));
  PipelinedModel out;
  out.replica = [=](int d) {
    auto g = model::llama_pipeline_model(s, c.seq_len, B, m, batcher, d, D, products);
    PipelinedReplica r{std::move(g.model), std::move(g.losses), {}, {}, nullptr};
    if (o.val_fraction > 0) {
      r.val_input = std::move(g.val_input);
      r.val_loss = std::move(g.val_loss);
    }
    return r;
  };
  out.at_length = [=](int T, const model::Fp8Products*) {
    return model::llama_pipeline_model(s, c.seq_len, 1, 1, batcher, 0, 1, products, T).model;
  };
  out.vocab = s.vocab;
  out.seq_len = c.seq_len;
  {
    // The plain trainer's prompt for --sample: the data's first token.
    const model::TokenData data = model::TokenData::load(o.data, s.vocab, o.data_format, true);
    STRATA_CHECK(data.size() > 0, Errc::invalid_argument, "--data '", o.data, "' holds no tokens");
    out.prompt = {static_cast<std::int32_t>(data[0])};
  }
  out.pipeline_layers = s.layers + 2;
  out.units_per_micro = static_cast<std::uint64_t>(B) * static_cast<std::uint64_t>(c.seq_len);
  out.remat = pipeline::parse_remat(model::remat_name(c.remat));
  out.describe = str_cat(model::describe(s), " from ", o.model, ", seq ", c.seq_len);
  out.split_hint = [n = out.pipeline_layers, blocks = s.layers](int vstages) {
    return str_cat("the model's ", n, " pipeline layers (the embedding, ", blocks, " blocks, the head) into ", vstages,
                   " evenly: choose --pipeline-stages (and --chunks) whose product divides ", n);
  };
  out.tensors = named(model::llama_params(s));
  out.layer_tensors = [s](int id) { return named(model::llama_pipeline_params(s, id)); };
  out.weights = hf_weights(o.model, s, quiet);
  out.state = nlohmann::json{{"hf_config", model::HfModelDir(o.model).config()}}.dump();
  out.check_state = [s, dir = o.model](const std::string& saved) { check_llama_state(saved, s, dir); };
  return out;
}

}  // namespace strata::train
