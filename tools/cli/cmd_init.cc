// `strata init --model DIR --out OUT [--dtype bf16|fp16|fp32] [--max-shard-size 5GB] [--seed S]`:
// a Hugging Face model directory holding the initial weights of the architecture DIR's
// config.json describes (a Llama, Mistral, Qwen2 or Qwen3 decoder; models/llama/config.h):
// Hugging Face's initialisation (linear weights and the embedding normal(0, initializer_range),
// norms one, biases zero), with the very values `strata train --model DIR --seed S` starts
// from when DIR holds config.json alone. For trying the fine-tuning path, sizing a model and
// tests, where no published checkpoint can be downloaded. Streams: each tensor is generated and
// written in pieces of at most 1M elements (models/hf/dir_writer.h: sharded, atomic through
// OUT.tmp), so memory stays a few fixed buffers however large the model.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "engine/layout.h"
#include "models/hf/dir_writer.h"
#include "models/hf/format.h"
#include "models/llama/config.h"
#include "runtime/core/error.h"
#include "runtime/core/units.h"
#include "tools/cli/command.h"
#include "train/interrupt.h"

namespace strata::cli {

using namespace strata::train;  // the library these commands parse flags for
namespace {

struct Options {
  std::string model, out, dtype = "bf16", max_shard = "5GB";
  std::uint64_t seed = 0;
};

int run(const Options& o) {
  const std::string path = o.model + "/config.json";
  std::ifstream in(path);
  STRATA_CHECK(in.good(), Errc::invalid_argument, "--model ", o.model,
               ": no config.json there; give a directory holding a Hugging Face config.json");
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    STRATA_THROW(Errc::invalid_argument, path, " is not valid JSON (", e.what(), ")");
  }
  const model::LlamaShape shape = model::parse_hf_config(config, path);
  const DType dtype = parse_dtype(o.dtype);
  STRATA_CHECK(dtype == DType::fp32 || dtype == DType::bf16 || dtype == DType::fp16, Errc::invalid_argument, "--dtype ",
               o.dtype, ": use bf16, fp16 or fp32");
  const auto params = model::llama_params(shape);
  model::HfDirWriter::Tensors tensors;
  for (const auto& p : params) tensors.emplace_back(p.name, p.shape);
  InterruptScope interrupt;
  const auto t0 = std::chrono::steady_clock::now();
  model::HfDirWriter writer(o.out, text.str(), tensors, dtype, model::hf::parse_shard_bytes(o.max_shard));
  constexpr std::size_t kPiece = 1 << 20;
  std::vector<float> buf(kPiece);
  for (const auto& p : params) {
    const engine::ParamSpec spec{p.name, p.shape, p.layer, p.init};
    std::size_t n = 1;
    for (auto d : p.shape) n *= static_cast<std::size_t>(d);
    for (std::size_t at = 0; at < n; at += kPiece) {
      check_interrupted("strata init");
      const std::size_t count = std::min(kPiece, n - at);
      engine::init_values(spec, o.seed, at, count, buf.data());
      writer.write(buf.data(), count);
    }
  }
  writer.finish();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("wrote %s: %s, %zu tensors in %zu file%s, %s of %s weights in %.1f s\n", o.out.c_str(),
              model::describe(shape).c_str(), params.size(), writer.shard_files().size(),
              writer.shard_files().size() == 1 ? "" : "s", format_bytes(writer.total_bytes()).c_str(),
              dtype_name(dtype), secs);
  return 0;
}

Action setup(CLI::App& cmd) {
  auto o = std::make_shared<Options>();
  cmd.add_option("--model", o->model, "Directory holding a Hugging Face config.json (Llama, Mistral, Qwen2, Qwen3)")
      ->required();
  cmd.add_option("--out", o->out, "Model directory to write (must not exist, or be empty)")->required();
  cmd.add_option("--dtype", o->dtype, "bf16 (default), fp16 or fp32");
  cmd.add_option("--max-shard-size", o->max_shard, "Largest weight file, as Hugging Face writes it (default 5GB)");
  cmd.add_option("--seed", o->seed, "The seed strata train --seed would start from");
  return [o] { return run(*o); };
}

const Registration reg("", "init",
                       "Write a Hugging Face model directory with the initial weights of a config.json's architecture",
                       setup);

}  // namespace
}  // namespace strata::cli
