// The GPT, the MLP and (pipelined_llama.h) a Hugging Face Llama-family directory as a
// pipelined trainer's model (see pipelined_model.h).
#include "train/pipelined_model.h"

#include "models/gpt/data.h"
#include "models/gpt/fp8_products.h"
#include "models/gpt/pipeline_layers.h"
#include "models/mlp_layers.h"
#include "runtime/core/error.h"
#include "train/llama.h"
#include "train/pipelined_llama.h"

namespace strata::train {
namespace {

template <typename Spec> std::vector<NamedShape> named(const std::vector<Spec>& specs) {
  std::vector<NamedShape> out;
  for (const auto& p : specs) out.push_back({p.name, p.shape});
  return out;
}

PipelinedModel gpt_model(const ModelOptions& o, const engine::EngineConfig& cfg, int B, int m, int D, bool quiet) {
  STRATA_CHECK(!o.data.empty(), Errc::invalid_argument, "--model gpt needs --data FILE (text to train on)");
  const model::GptConfig gpt = gpt_config(o, cfg);
  const auto batcher =
      model::load_batcher(o.data, gpt.shape.vocab, o.data_format, gpt.seq_len, o.val_fraction, gpt.seed, quiet);
  const auto products = model::ops::products_for(engine::compute_dtype_of(cfg));
  PipelinedModel out;
  out.replica = [=](int d) {
    auto g = model::gpt_pipeline_model(gpt, B, m, batcher, d, D, products);
    PipelinedReplica r{std::move(g.model), std::move(g.losses), {}, {}, std::move(g.fp8)};
    if (o.val_fraction > 0) {
      r.val_input = std::move(g.val_input);
      r.val_loss = std::move(g.val_loss);
    }
    return r;
  };
  out.at_length = [=](int T, const model::Fp8Products* trained) {
    auto g = model::gpt_pipeline_model(gpt, 1, 1, batcher, 0, 1, products, T);
    if (g.fp8 && trained != nullptr) g.fp8->restore(trained->histories());
    return std::move(g.model);
  };
  out.vocab = gpt.shape.vocab;
  out.seq_len = gpt.seq_len;
  out.pipeline_layers = gpt.shape.layers + 2;
  out.units_per_micro = static_cast<std::uint64_t>(B) * static_cast<std::uint64_t>(gpt.seq_len);
  out.remat = pipeline::parse_remat(model::remat_name(gpt.remat));
  out.describe =
      str_cat("GPT ", gpt.shape.layers, " blocks x ", gpt.shape.d_model, gpt.unit_scaled ? ", unit-scaled" : "");
  out.split_hint = [n = out.pipeline_layers, blocks = gpt.shape.layers](int vstages) {
    return str_cat("the GPT's ", n, " pipeline layers (the embeddings, ", blocks,
                   " blocks, the head) evenly: give --layers a number of blocks such that blocks + 2 is a multiple of ",
                   vstages);
  };
  out.tensors = named(model::gpt_params(gpt.shape));
  out.layer_tensors = [shape = gpt.shape](int id) { return named(model::gpt_pipeline_params(shape, id)); };
  return out;
}

PipelinedModel mlp_model(const ModelOptions& o, const engine::EngineConfig& cfg, int B, int m, int D) {
  check_mlp_precision(cfg);
  const model::MlpConfig mlp = mlp_config(o);
  PipelinedModel out;
  auto data = std::make_shared<const model::MlpData>(mlp.hidden, mlp.seed);  // one teacher for the process
  out.replica = [=](int d) {
    auto g = model::mlp_pipeline_model(mlp, B, m, d, D, data);
    return PipelinedReplica{std::move(g.model), std::move(g.losses), {}, {}, nullptr};
  };
  out.pipeline_layers = mlp.layers;
  out.units_per_micro = static_cast<std::uint64_t>(B);
  out.remat = config_remat(cfg) ? pipeline::Remat::always : pipeline::Remat::never;
  out.describe = str_cat("mlp ", mlp.layers, " x ", mlp.hidden);
  out.split_hint = [n = mlp.layers](int vstages) {
    return str_cat("the MLP's ", n, " layers evenly: give --layers a multiple of ", vstages);
  };
  const auto specs = model::mlp_param_specs(mlp);
  out.tensors = named(specs);
  out.layer_tensors = [specs](int id) {
    return named(std::vector<engine::ParamSpec>(specs.begin() + 2 * id, specs.begin() + 2 * id + 2));
  };
  return out;
}

}  // namespace

PipelinedModel pipelined_model(const ModelOptions& o, const engine::EngineConfig& cfg, int micro_batch,
                               int micro_batches, int replicas, bool quiet) {
  if (o.model == "gpt") return gpt_model(o, cfg, micro_batch, micro_batches, replicas, quiet);
  if (is_hf_model_dir(o.model)) return llama_pipelined_model(o, cfg, micro_batch, micro_batches, replicas, quiet);
  STRATA_CHECK(o.model == "mlp", Errc::invalid_argument, "--model ", o.model,
               " has no pipeline layers: --pipeline-stages trains gpt, mlp or a Hugging Face model directory");
  return mlp_model(o, cfg, micro_batch, micro_batches, replicas);
}

}  // namespace strata::train
