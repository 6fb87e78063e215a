// What `strata pipeline` runs (see pipeline_model.h).
#include "tools/cli/pipeline_model.h"

#include "models/gpt/data.h"
#include "models/gpt/pipeline_layers.h"
#include "runtime/core/error.h"
#include "tools/cli/flags.h"

namespace strata::cli {

using namespace strata::train;  // the library these commands parse flags for

void add_pipeline_model_options(CLI::App& cmd, PipelineModelFlags& f) {
  cmd.add_option("--model", f.model,
                 "synthetic (tanh-linear layers, or fixed times with --layer-ms) or gpt (the GPT strata train "
                 "trains: embeddings, --layers blocks, head; needs --data)");
  auto& m = f.gpt;
  cmd.add_option("--preset", m.preset, "GPT: tiny|124M|350M|774M|1.5B (then --layers/--d-model/... override)");
  cmd.add_option("--heads", m.heads, "GPT: attention heads")->check(CLI::Range(0, 1024));
  cmd.add_option("--d-model", m.d_model, "GPT: width")->check(CLI::Range(0, 1 << 16));
  cmd.add_option("--seq-len", m.seq_len, "GPT: tokens per sequence")->check(CLI::Range(0, 1 << 16));
  cmd.add_option("--positions", m.positions, "GPT: rows of the position table")->check(CLI::Range(0, 1 << 16));
  cmd.add_option("--vocab", m.vocab, "GPT: vocabulary (256 for bytes)")->check(CLI::Range(0, 1 << 24));
  cmd.add_option("--data", m.data, "GPT: training text, a file or directory (as strata train --data)");
  cmd.add_option("--data-format", m.data_format, "GPT: auto|bytes|tokens|u16|u32");
  cmd.add_option("--micro-batch-size", f.micro_batch, "GPT: sequences per micro-batch")->check(CLI::Range(1, 4096));
  cmd.add_option("--seed", m.seed, "GPT: seed of the initial values and the data order (as strata train's)");
}

std::uint64_t pipeline_model_hidden(const PipelineModelFlags& f, int layers, const pipeline::SyntheticModelSpec& spec) {
  if (f.model != "gpt") return spec.width;
  ModelOptions m = f.gpt;
  m.model = "gpt";
  if (layers > 0) m.layers = layers;
  return model_hidden_size(m);
}

PipelineModelChoice make_pipeline_model(const PipelineModelFlags& f, int layers,
                                        const pipeline::SyntheticModelSpec& spec, int micro, int replicas,
                                        model::ops::Products products) {
  PipelineModelChoice out;
  if (f.model == "synthetic") {
    out.model = pipeline::synthetic_model(spec);
    out.of_replica = [spec](int d) {
      auto sd = spec;
      sd.seed = spec.seed + 1000 * static_cast<std::uint64_t>(d);  // replica d's own inputs and targets
      return pipeline::synthetic_model(sd);
    };
    out.hidden = spec.width;
    out.describe = str_cat(layers, " synthetic layers");
    return out;
  }
  STRATA_CHECK(f.model == "gpt", Errc::invalid_argument, "--model ", f.model, " is not one of synthetic, gpt");
  STRATA_CHECK(!f.gpt.data.empty(), Errc::invalid_argument,
               "--model gpt needs --data FILE (text to train on, read as bytes; or llm.c tokens)");
  ModelOptions m = f.gpt;
  m.model = "gpt";
  if (layers > 0) m.layers = layers;
  const model::GptConfig c = gpt_config(m, false);
  const auto batcher =
      model::load_batcher(m.data, c.shape.vocab, m.data_format, c.seq_len, m.val_fraction, c.seed, true);
  const int B = f.micro_batch;
  auto g = model::gpt_pipeline_model(c, B, micro, batcher, 0, replicas, products);
  out.model = std::move(g.model);
  out.losses = g.losses;
  out.of_replica = [model0 = out.model, c, B, micro, batcher, replicas, products](int d) {
    return d == 0 ? model0 : model::gpt_pipeline_model(c, B, micro, batcher, d, replicas, products).model;
  };
  out.tokens_per_micro = static_cast<std::uint64_t>(B) * static_cast<std::uint64_t>(c.seq_len);
  out.hidden = static_cast<std::uint64_t>(c.shape.d_model);
  out.describe = str_cat("GPT ", c.shape.layers, " blocks x ", c.shape.d_model, " (", c.shape.heads, " heads, vocab ",
                         c.shape.vocab, ", ", model::gpt_parameter_count(c.shape), " parameters), ", B, " x ",
                         c.seq_len, " tokens per micro-batch, ", c.shape.layers + 2, " pipeline layers");
  return out;
}

}  // namespace strata::cli
