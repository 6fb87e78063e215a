// What `strata pipeline` runs: the synthetic layers (tanh-linear compute, or fixed F/B/W times
// with --layer-ms) or, with --model gpt, the GPT `strata train` trains, as pipeline layers
// (models/gpt/pipeline_layers.h) on byte-level or tokenized text from --data.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "models/gpt/gemm.h"
#include "pipeline/model.h"
#include "train/model.h"

namespace strata::cli {

struct PipelineModelFlags {
  std::string model = "synthetic";
  train::ModelOptions gpt;  // --preset --heads --d-model --seq-len --positions --vocab --data --data-format
  int micro_batch = 1;      // sequences per micro-batch (GPT)
};

// Adds --model and the GPT's flags (the caller owns --layers: blocks, for the GPT).
void add_pipeline_model_options(CLI::App& cmd, PipelineModelFlags& f);

struct PipelineModelChoice {
  pipeline::PipelineModel model;  // replica 0's
  // Replica d's (its own inputs: data-parallel rank d of `replicas`).
  std::function<pipeline::PipelineModel(int replica)> of_replica;
  std::shared_ptr<std::vector<double>> losses;  // the GPT's per micro-batch token-loss sums (replica 0); null otherwise
  std::uint64_t tokens_per_micro = 0;           // GPT
  std::uint64_t hidden = 0;                     // for a config's "auto" values
  std::string describe;                         // one line
};

// The model the flags name, for `micro` micro-batches per step and `replicas` replicas;
// `spec` is the synthetic model's, `products` the GPT's weight products. Throws
// Errc::invalid_argument naming the flag.
PipelineModelChoice make_pipeline_model(const PipelineModelFlags& f, int layers,
                                        const pipeline::SyntheticModelSpec& spec, int micro, int replicas,
                                        model::ops::Products products = model::ops::Products::fp32);

// The model's width, for a config's "auto" values, without building it.
std::uint64_t pipeline_model_hidden(const PipelineModelFlags& f, int layers, const pipeline::SyntheticModelSpec& spec);

}  // namespace strata::cli
