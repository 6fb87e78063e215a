// The Llama family as pipeline layers (models/llama/pipeline_layers.h): the layers compute the
// loss and gradients of the Llama's own pass (LlamaPass, the code `strata train --model DIR`
// runs) bit for bit, a tied head's embedding included, for a Llama, a tied Llama and a Qwen3
// (q/k norms, q/k/v biases); the cut names the Hugging Face tensors in the engine's order;
// every schedule the Llama pipeline runs (the zero-bubble ones too: the blocks split B from W)
// ends, stages as threads, with the sequential loop's parameters bit for bit. And the pass's
// head taken in row chunks (a large vocabulary) against the same rows in one chunk.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>

#include "engine/layout.h"
#include "models/gpt/array_access.h"
#include "models/llama/pass.h"
#include "models/llama/pipeline_layers.h"
#include "pipeline/generators.h"
#include "pipeline/runner.h"
#include "runtime/core/error.h"
#include "runtime/core/random.h"
#include "runtime/device/device.h"
#include "tests/support/fp32_bound.h"
#include "tests/support/same_bits.h"

using namespace strata;
using namespace strata::model;

namespace {

using test::same_bits;

LlamaShape small_llama(const std::string& kind) {
  LlamaShape s;
  s.layers = 2;
  s.hidden = 32;
  s.intermediate = 48;
  s.heads = 4;
  s.kv_heads = 2;
  s.head_dim = 8;
  s.vocab = 256;
  s.max_positions = 64;
  s.rms_eps = 1e-5;
  s.tied = kind == "tied";
  if (kind == "qwen3") {
    s.model_type = "qwen3";
    s.qk_norm = true;
    s.qkv_bias = true;  // not Qwen3's, but the slots the biases take are worth crossing
  }
  return s;
}

// Byte-level training text in a temporary file, and the batcher over it.
struct Text {
  std::filesystem::path path;
  TokenData data;
  std::shared_ptr<Batcher> batcher;
  explicit Text(int T) {
    path = std::filesystem::temp_directory_path() / ("strata-llama-pipeline-" + std::to_string(::getpid()) + ".txt");
    std::ofstream f(path);
    for (int i = 0; i < 200; ++i) f << "line " << i * 7919 % 1000 << ": the quick brown fox, " << i % 13 << "\n";
    f.close();
    data = TokenData::load(path.string(), 256, "bytes", true);
    batcher = std::make_shared<Batcher>(data, path.string(), T, 0.1, 3);
  }
  ~Text() { std::filesystem::remove(path); }
};

std::vector<int> all_layers(const pipeline::PipelineModel& m) {
  std::vector<int> v(m.layers.size());
  std::iota(v.begin(), v.end(), 0);
  return v;
}

// The engine's initial values of every tensor for `seed`, grouped by engine layer.
std::vector<std::vector<NamedTensor>> initial_by_layer(const LlamaShape& s, std::uint64_t seed) {
  std::vector<std::vector<NamedTensor>> out(static_cast<std::size_t>(s.layers + 2));
  for (const auto& p : llama_params(s)) {
    std::size_t n = 1;
    for (auto e : p.shape) n *= static_cast<std::size_t>(e);
    NamedTensor t{p.name, p.shape, std::vector<float>(n)};
    engine::init_values(engine::ParamSpec{p.name, p.shape, p.layer, p.init}, seed, 0, n, t.data.data());
    out[static_cast<std::size_t>(p.layer)].push_back(std::move(t));
  }
  return out;
}

}  // namespace

TEST_CASE("the Llama's pipeline layers compute the loss and gradients of its own pass", "[llama][pipeline]") {
  const std::string kind = GENERATE("llama", "tied", "qwen3");
  INFO(kind);
  const LlamaShape s = small_llama(kind);
  const int B = 2, T = 16;
  Text text(T);
  auto g = llama_pipeline_model(s, T, B, 1, text.batcher);
  REQUIRE(g.model.tie.has_value() == s.tied);
  pipeline::LocalParameterStore store(g.model, all_layers(g.model), 5);
  pipeline::run_sequential(g.model, 1, store);

  auto params = initial_by_layer(s, 5);
  device::DeviceOptions o;
  o.backend = device::Backend::host;
  o.budget_bytes = LlamaPass::device_bytes(s, B, T, Remat::never) + (1 << 20);
  auto dev = device::Device::create(o);
  LlamaPass pass(s, B, T, Remat::never, *dev);
  ArrayAccess access(params);
  std::vector<std::int32_t> in(static_cast<std::size_t>(B * T)), tg(in.size());
  text.batcher->train_batch(0, B, 0, 1, 0, B, in.data(), tg.data());
  const double loss = pass.train(access, in.data(), tg.data(), B, T, 1.0f);
  CHECK((*g.losses)[0] == loss);
  CHECK(loss / (B * T) == Approx(std::log(256.0)).epsilon(0.05));  // near-uniform predictions at the start

  // Each layer's gradient is the pass's tensors concatenated, bit for bit (a tied head's
  // embedding gradient arrives at layer 0 through the tie, added as the pass adds it).
  const auto grads = access.all_grads();
  std::size_t t = 0;
  for (int layer = 0; layer < s.layers + 2; ++layer) {
    std::vector<float> want;
    const auto names = llama_pipeline_params(s, layer);
    for (std::size_t i = 0; i < names.size(); ++i) {
      if (layer == s.layers + 1 && s.tied && i + 1 == names.size()) break;  // layer 0's
      REQUIRE(grads[t].name == names[i].name);
      want.insert(want.end(), grads[t].data.begin(), grads[t].data.end());
      ++t;
    }
    INFO("layer " << layer);
    CHECK(same_bits(store.grads_of(layer), want));
  }
  CHECK(t == grads.size());
}

TEST_CASE("the Llama's pipeline cut holds the Hugging Face tensors in the engine's order", "[llama][pipeline]") {
  const std::string kind = GENERATE("llama", "tied", "qwen3");
  INFO(kind);
  const LlamaShape s = small_llama(kind);
  Text text(16);
  const auto g = llama_pipeline_model(s, 16, 1, 1, text.batcher);
  REQUIRE(g.model.layers.size() == static_cast<std::size_t>(s.layers + 2));
  std::vector<std::string> cut;
  for (int layer = 0; layer < s.layers + 2; ++layer) {
    const auto tensors = g.model.layers[static_cast<std::size_t>(layer)]->tensors();
    const auto params = llama_pipeline_params(s, layer);
    REQUIRE(tensors.size() == params.size());
    std::size_t count = 0;
    for (std::size_t i = 0; i < params.size(); ++i) {
      CHECK(tensors[i].name == params[i].name);
      CHECK(tensors[i].shape == params[i].shape);
      count += static_cast<std::size_t>(
          std::accumulate(params[i].shape.begin(), params[i].shape.end(), std::int64_t{1}, std::multiplies<>()));
      if (!(layer == s.layers + 1 && s.tied && i + 1 == params.size())) cut.push_back(params[i].name);
    }
    CHECK(g.model.layers[static_cast<std::size_t>(layer)]->param_count() == count);
  }
  std::vector<std::string> all;
  for (const auto& p : llama_params(s)) all.push_back(p.name);
  CHECK(cut == all);
  const auto head = llama_pipeline_params(s, s.layers + 1);
  CHECK(head.back().name == (s.tied ? "model.embed_tokens.weight" : "lm_head.weight"));
  CHECK_THROWS_AS(llama_pipeline_params(s, s.layers + 2), strata::Error);
}

TEST_CASE("a pipelined Llama trains to the sequential loop's parameters bit for bit", "[llama][pipeline]") {
  using namespace strata::pipeline;
  const Schedule sched =
      GENERATE(gpipe(2, 4), one_f_one_b(2, 4), interleaved_1f1b(2, 4, 2), gpipe(1, 3), zb_h1(2, 4), zb_h2(2, 4));
  const std::string kind = GENERATE("llama", "tied", "qwen3");
  const pipeline::Remat remat = GENERATE(pipeline::Remat::never, pipeline::Remat::always);
  INFO(sched.kind << " p=" << sched.stages << " v=" << sched.chunks << " " << kind << " remat "
                  << pipeline::remat_name(remat));
  const LlamaShape s = small_llama(kind);
  Text text(16);
  auto g = llama_pipeline_model(s, 16, 2, sched.micro_batches, text.batcher);
  constexpr int kSteps = 2;
  constexpr float kLr = 0.05f;
  LocalParameterStore reference(g.model, all_layers(g.model), 5, kLr);
  for (int step = 0; step < kSteps; ++step) {
    run_sequential(g.model, sched.micro_batches, reference, step);
    reference.optimizer_step();
  }
  const std::vector<double> want_losses = *g.losses;
  std::vector<std::unique_ptr<LocalParameterStore>> stores;
  for (int st = 0; st < sched.stages; ++st)
    stores.push_back(std::make_unique<LocalParameterStore>(g.model, stage_layers(sched, g.model, st), 5, kLr));
  std::vector<ParameterStore*> ptrs;
  for (auto& p : stores) ptrs.push_back(p.get());
  ExecutorOptions o;
  o.remat = remat;
  run_stages_as_threads(sched, g.model, ptrs, o, kSteps);
  CHECK(*g.losses == want_losses);
  for (const auto& st : stores) {
    for (int id : st->layers()) {
      INFO("layer " << id);
      CHECK(same_bits(st->params_of(id), reference.params_of(id)));
      CHECK(same_bits(st->grads_of(id), reference.grads_of(id)));
    }
  }
}

TEST_CASE("the Llama pass's head in row chunks gives the loss and gradients of one product over all rows",
          "[llama][memory]") {
  // A 16,384-entry vocabulary: 256 rows a chunk (head_chunk_rows), so a 4 x 64 micro-batch is
  // one chunk and 16 x 64 four; the four 4-sequence passes summed are the 16-sequence pass.
  const std::string kind = GENERATE("llama", "tied");
  INFO(kind);
  LlamaShape s = small_llama(kind);
  s.vocab = 16384;
  const int B = 16, T = 64, part = 4;
  REQUIRE(head_chunk_rows(static_cast<std::size_t>(B) * T, B, s.vocab, false) == 256);
  std::vector<std::int32_t> in(static_cast<std::size_t>(B) * T), tg(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    in[i] = static_cast<std::int32_t>(splitmix64(i) % 16384);
    tg[i] = static_cast<std::int32_t>(splitmix64(i + 99991) % 16384);
  }
  device::DeviceOptions o;
  o.budget_bytes =
      LlamaPass::device_bytes(s, B, T, Remat::never) + LlamaPass::device_bytes(s, part, T, Remat::never) + (1 << 20);
  auto dev = device::Device::create(o);
  auto params = initial_by_layer(s, 5);
  ArrayAccess all(params);
  LlamaPass pass(s, B, T, Remat::never, *dev);
  const double loss = pass.train(all, in.data(), tg.data(), B, T, 1.0f);
  const auto grads = all.all_grads();
  // The last position's logits through the chunked forward equal the whole pass's.
  std::vector<float> last(static_cast<std::size_t>(B) * s.vocab), last_part(static_cast<std::size_t>(part) * s.vocab);
  pass.last_logits(all, in.data(), B, T, last.data());
  double parts = 0;
  std::vector<std::vector<double>> sum(grads.size());
  for (std::size_t i = 0; i < grads.size(); ++i) sum[i].assign(grads[i].data.size(), 0.0);
  LlamaPass small(s, part, T, Remat::never, *dev);
  for (int p = 0; p < B / part; ++p) {
    ArrayAccess one(params);
    const std::size_t at = static_cast<std::size_t>(p) * part * T;
    parts += small.train(one, in.data() + at, tg.data() + at, part, T, static_cast<float>(part) / B);
    const auto g = one.all_grads();
    for (std::size_t i = 0; i < g.size(); ++i)
      for (std::size_t j = 0; j < g[i].data.size(); ++j) sum[i][j] += g[i].data[j];
    small.last_logits(one, in.data() + at, part, T, last_part.data());
    const auto from = last.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(p) * part * s.vocab);
    CHECK(strata::test::normwise_difference(last_part, std::vector<float>(from, from + last_part.size())) <= 1e-5);
  }
  CHECK(std::abs(loss - parts) <= 1e-5 * std::abs(parts));
  for (std::size_t i = 0; i < grads.size(); ++i) {
    const double d = strata::test::normwise_difference(grads[i].data, sum[i]);
    INFO(grads[i].name << ": normwise difference " << d);
    CHECK(d <= 1e-4);
  }
}
