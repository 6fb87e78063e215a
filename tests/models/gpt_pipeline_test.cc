// The GPT as pipeline layers (models/gpt/pipeline_layers.h): the block's split backward gives
// the fused backward's bits; the layers compute the loss and gradients of the GPT's own pass
// (GptPass, the code `strata train` runs), the tied embedding included; and every schedule's
// pipelined run, stages as threads, ends with the parameters of the sequential loop bit for bit;
// layers bound to a stream (PipelineModel::bind) give the same bits; a stage's replayed
// device peak counts the layers' work buffer.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

#include "engine/stage_store.h"
#include "models/gpt/array_access.h"
#include "models/gpt/block.h"
#include "models/gpt/fp8_products.h"
#include "models/gpt/pass.h"
#include "models/gpt/pipeline_layers.h"
#include "models/gpt/unit_scale.h"
#include "pipeline/generators.h"
#include "pipeline/memory.h"
#include "pipeline/runner.h"
#include "runtime/core/random.h"
#include "runtime/device/arena.h"
#include "runtime/device/device.h"
#include "tests/support/randn.h"
#include "tests/support/same_bits.h"

using namespace strata;
using namespace strata::model;
using strata::test::randn;

namespace {

using test::same_bits;

GptConfig small_gpt() {
  GptConfig c;
  c.shape = GptShape{6, 2, 16, 16, 256};  // 8 pipeline layers: embeddings, 6 blocks, head
  c.seq_len = 8;
  return c;
}

// Byte-level training text in a temporary file, and the batcher over it.
struct Text {
  std::filesystem::path path;
  TokenData data;
  std::shared_ptr<Batcher> batcher;
  explicit Text(int T) {
    path = std::filesystem::temp_directory_path() / ("strata-gpt-pipeline-" + std::to_string(::getpid()) + ".txt");
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
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int>(i);
  return v;
}

}  // namespace

TEST_CASE("the GPT block's split backward (B, then W) gives block_backward's bits", "[gpt][pipeline]") {
  const bool unit = GENERATE(false, true);
  const bool fp8 = GENERATE(false, true);
  INFO((unit ? "unit-scaled" : "plain") << " block" << (fp8 ? " with FP8 products" : ""));
  BlockDims d;
  d.B = 2, d.T = 8, d.C = 32, d.NH = 4;
  const GptShape shape{3, 4, 32, 8, 256};
  const UnitScales scales(shape, 8);
  d.block = 1;  // unit-scaled: residual adds 2 and 3, weights other than 1; FP8: sites 4..7
  if (unit) d.unit = &scales;
  // Two FP8 states (fused, split) with the same delayed-scaling history: amax 3 for every
  // operand of the block's sites, so each quantizes at a history scale, not its own amax.
  fp8::Recipe recipe;
  recipe.enabled = true;
  const auto sf = Fp8Products::scratch_floats(shape, d.tokens());
  std::vector<float> q_fused(sf.total()), q_split(sf.total());
  auto products = [&](std::vector<float>& q) {
    auto p = std::make_unique<Fp8Products>(recipe, shape,
                                           Fp8Products::Scratch{q.data(), q.data() + sf.x, q.data() + sf.x + sf.w});
    p->restore(std::vector<std::vector<float>>(static_cast<std::size_t>(3 * Fp8Products::site_count(shape)), {3.0f}));
    p->set_recording(true);
    return p;
  };
  const auto fp8_fused = products(q_fused), fp8_split = products(q_split);
  const std::size_t NC = d.tokens() * static_cast<std::size_t>(d.C), C = 32;
  const std::array<std::size_t, kBlockParams> n{C, C, 3 * C * C, 3 * C, C * C, C, C, C, 4 * C * C, 4 * C, 4 * C * C, C};
  std::vector<std::vector<float>> w;
  for (std::size_t k = 0; k < kBlockParams; ++k) w.push_back(randn(n[k], 100 + k, k == ln1_w || k == ln2_w ? 1 : 0.1f));
  BlockWeights bw{};
  for (std::size_t k = 0; k < kBlockParams; ++k) bw[k] = w[k].data();
  const auto x = randn(NC, 7), dy = randn(NC, 9, 0.01f);
  std::vector<float> acts(BlockActs::floats(d)), scratch(BlockScratch::floats(d)), split(BlockSplit::floats(d));
  BlockActs a{};
  a.carve(acts.data(), d);
  std::vector<float> out(NC);
  if (fp8) d.fp8 = fp8_fused.get();
  block_forward(out.data(), x.data(), bw, a, d);

  auto grads = [&](std::vector<std::vector<float>>& g) {
    BlockGrads p{};
    for (std::size_t k = 0; k < kBlockParams; ++k) {
      g.emplace_back(n[k], 0.0f);
      p[k] = g.back().data();
    }
    return p;
  };
  std::vector<std::vector<float>> g_fused, g_split;
  std::vector<float> dx_fused = dy, dx_split = dy;
  BlockScratch s{};
  s.carve(scratch.data(), d);
  block_backward(dx_fused.data(), x.data(), bw, grads(g_fused), a, s, d);
  if (fp8) {  // the split's own forward (the same activations), recording its amax
    d.fp8 = fp8_split.get();
    std::vector<float> again(NC);
    block_forward(again.data(), x.data(), bw, a, d);
    CHECK(same_bits(again, out));
  }
  BlockSplit k{};
  k.carve(split.data(), d);
  block_backward_input(dx_split.data(), x.data(), bw, a, k, d);
  block_backward_weight(grads(g_split), dy.data(), x.data(), a, k, d);
  CHECK(same_bits(dx_split, dx_fused));
  for (std::size_t i = 0; i < kBlockParams; ++i) {
    INFO("block parameter " << i);
    CHECK(same_bits(g_split[i], g_fused[i]));
  }
  double norm = 0;
  for (float v : g_fused[fc_w]) norm += std::fabs(v);
  CHECK(norm > 0);
  if (fp8) {
    // The halves record the fused backward's amax, every operand of the block's four sites.
    const auto fused = fp8_fused->step_amax(), split_amax = fp8_split->step_amax();
    CHECK(same_bits(split_amax, fused));
    for (int i = 3 * 4 * d.block; i < 3 * 4 * (d.block + 1); ++i) CHECK(fused[static_cast<std::size_t>(i)] > 0.0f);
    // And FP8 changes the gradients: the block without FP8 sites gives other bits.
    d.fp8 = nullptr;
    std::vector<std::vector<float>> g_plain;
    std::vector<float> dx_plain = dy;
    block_forward(out.data(), x.data(), bw, a, d);
    block_backward(dx_plain.data(), x.data(), bw, grads(g_plain), a, s, d);
    CHECK_FALSE(same_bits(g_plain[fc_w], g_fused[fc_w]));
  }
}

TEST_CASE("the GPT's pipeline layers compute the loss and gradients of its own pass", "[gpt][pipeline]") {
  GptConfig c = small_gpt();
  c.unit_scaled = GENERATE(false, true);
  c.fp8.enabled = GENERATE(false, true);
  INFO((c.unit_scaled ? "unit-scaled" : "plain") << " GPT" << (c.fp8.enabled ? " with FP8 products" : ""));
  const int B = 2, T = c.seq_len;
  Text text(T);
  auto g = gpt_pipeline_model(c, B, 1, text.batcher);
  REQUIRE((g.fp8 != nullptr) == c.fp8.enabled);
  if (g.fp8) g.fp8->set_recording(true);
  pipeline::LocalParameterStore store(g.model, all_layers(g.model), 5);
  pipeline::run_sequential(g.model, 1, store);
  const double pipelined_loss = (*g.losses)[0];

  // The pass over the same weights and batch.
  auto params = ArrayAccess::by_layer(c.shape, gpt_initial_params(c.shape, 5, c.unit_scaled));
  device::DeviceOptions o;
  o.backend = device::Backend::host;
  o.budget_bytes = GptPass::device_bytes(c.shape, B, T, Remat::never, c.fp8.enabled) + (1 << 20);
  auto dev = device::Device::create(o);
  GptPass pass(c.shape, B, T, Remat::never, *dev, ops::Products::fp32, c.fp8, c.unit_scaled);
  ArrayAccess access(params);
  std::vector<std::int32_t> in(static_cast<std::size_t>(B * T)), tg(in.size());
  text.batcher->train_batch(0, B, 0, 1, 0, B, in.data(), tg.data());
  const double loss = pass.train(access, in.data(), tg.data(), B, T, 1.0f);
  CHECK(pipelined_loss == loss);
  // Near-uniform predictions at the start (the unit-scaled head's logits have unit variance).
  CHECK(loss / (B * T) == Approx(std::log(256.0) + (c.unit_scaled ? 0.5 : 0.0)).epsilon(0.05));

  // Each layer's gradient: the pass's tensors concatenated, the same bits. The token
  // embedding's two parts (the head's and the embedding's) add in the same order: the
  // embedding's rows of a token are summed first and added to the head's part once.
  const auto grads = access.all_grads();
  std::size_t t = 0;
  for (int layer = 0; layer < c.shape.layers + 2; ++layer) {
    std::vector<float> want;
    for (std::size_t i = 0; i < gpt_pipeline_params(c.shape, layer).size(); ++i, ++t) {
      if (layer == c.shape.layers + 1 && i == 2) break;  // the head's tied wte is layer 0's
      want.insert(want.end(), grads[t].data.begin(), grads[t].data.end());
    }
    const auto& got = store.grads_of(layer);
    INFO("layer " << layer);
    REQUIRE(got.size() == want.size());
    CHECK(same_bits(got, want));
  }
  // The layers' FP8 products recorded the pass's amax for every operand of every site.
  if (g.fp8) CHECK(same_bits(g.fp8->step_amax(), pass.fp8()->step_amax()));
}

TEST_CASE("a pipelined GPT trains to the sequential loop's parameters bit for bit, every schedule", "[gpt][pipeline]") {
  using namespace strata::pipeline;
  const Schedule s = GENERATE(gpipe(2, 4), one_f_one_b(4, 8), interleaved_1f1b(2, 4, 2), interleaved_1f1b(4, 4, 2),
                              zb_h1(4, 8), zb_h2(2, 4), gpipe(1, 3));
  const pipeline::Remat remat = GENERATE(pipeline::Remat::never, pipeline::Remat::always);
  INFO(s.kind << " p=" << s.stages << " m=" << s.micro_batches << " v=" << s.chunks
              << " remat=" << pipeline::remat_name(remat));
  const GptConfig c = small_gpt();
  Text text(c.seq_len);
  auto g = gpt_pipeline_model(c, 2, s.micro_batches, text.batcher);
  constexpr int kSteps = 2;
  constexpr float kLr = 0.05f;
  LocalParameterStore reference(g.model, all_layers(g.model), 5, kLr);
  for (int step = 0; step < kSteps; ++step) {
    run_sequential(g.model, s.micro_batches, reference, step);
    reference.optimizer_step();
  }
  const std::vector<double> want_losses = *g.losses;
  std::vector<std::unique_ptr<LocalParameterStore>> stores;
  for (int st = 0; st < s.stages; ++st)
    stores.push_back(std::make_unique<LocalParameterStore>(g.model, stage_layers(s, g.model, st), 5, kLr));
  std::vector<ParameterStore*> ptrs;
  for (auto& p : stores) ptrs.push_back(p.get());
  ExecutorOptions o;
  o.remat = remat;
  run_stages_as_threads(s, g.model, ptrs, o, kSteps);
  CHECK(*g.losses == want_losses);
  for (const auto& st : stores) {
    for (int id : st->layers()) {
      INFO("layer " << id);
      CHECK(same_bits(st->params_of(id), reference.params_of(id)));
      CHECK(same_bits(st->grads_of(id), reference.grads_of(id)));
    }
  }
}

// PipelineModel::bind, which a CUDA stage calls with its device and stream: on the host
// device the bound layers get kernels of their own (make_kernels) and must give the
// unbound layers' bits; FP8 products are refused by name (pipelined, they run on host-device
// stages only). The CUDA side is tests/engine/pipeline_cuda_test.cc.
TEST_CASE("the GPT's layers bound to a stream compute the unbound layers' bits", "[gpt][pipeline]") {
  GptConfig c = small_gpt();
  c.unit_scaled = GENERATE(false, true);
  INFO((c.unit_scaled ? "unit-scaled" : "plain") << " GPT");
  Text text(c.seq_len);
  auto g = gpt_pipeline_model(c, 2, 3, text.batcher);
  REQUIRE(g.model.bind);
  auto dev = device::Device::create({});
  auto stream = dev->create_stream();
  pipeline::PipelineModel bound = g.model;
  bound.layers = g.model.bind(*dev, *stream);
  REQUIRE(bound.layers.size() == g.model.layers.size());
  for (std::size_t i = 0; i < bound.layers.size(); ++i) {
    CHECK(bound.layers[i] != g.model.layers[i]);  // new objects, on the new kernels
    CHECK(bound.layers[i]->name() == g.model.layers[i]->name());
    CHECK(bound.layers[i]->param_count() == g.model.layers[i]->param_count());
  }
  pipeline::LocalParameterStore want(g.model, all_layers(g.model), 5, 0.05f), got(bound, all_layers(bound), 5, 0.05f);
  for (int step = 0; step < 2; ++step) {
    pipeline::run_sequential(g.model, 3, want, step);
    want.optimizer_step();
    const std::vector<double> losses = *g.losses;
    pipeline::run_sequential(bound, 3, got, step);
    got.optimizer_step();
    CHECK(*g.losses == losses);
  }
  for (int id : want.layers()) {
    INFO("layer " << id);
    CHECK(same_bits(got.params_of(id), want.params_of(id)));
  }

  c.fp8.enabled = true;
  const auto f = gpt_pipeline_model(c, 2, 3, text.batcher);
  CHECK_THROWS_WITH(f.model.bind(*dev, *stream), Catch::Contains("FP8 products of pipelined layers"));
}

// The layers' scratch (the FP8 operands, the head's ln_f gradient, the unit-scaled
// embedding's scaled gradient) is the executor's work buffer on the stage's device: the
// replayed peak, which sizes a stage's reservation, is the measured one with it.
TEST_CASE("a GPT stage's replayed device peak counts its layers' work buffer", "[gpt][pipeline]") {
  using namespace strata::pipeline;
  GptConfig c = small_gpt();
  c.unit_scaled = GENERATE(false, true);
  c.fp8.enabled = GENERATE(false, true);
  INFO((c.unit_scaled ? "unit-scaled" : "plain") << " GPT" << (c.fp8.enabled ? " with FP8 products" : ""));
  const Schedule s = zb_h1(2, 4);
  Text text(c.seq_len);
  const int B = 2;
  auto g = gpt_pipeline_model(c, B, s.micro_batches, text.batcher);
  const std::size_t rows = static_cast<std::size_t>(B * c.seq_len), C = static_cast<std::size_t>(c.shape.d_model);
  const std::size_t fp8 = c.fp8.enabled ? Fp8Products::scratch_floats(c.shape, rows).total() : 0;
  CHECK(g.model.layers.front()->work_floats(rows) == (c.unit_scaled ? rows * C : 0));
  CHECK(g.model.layers[1]->work_floats(rows) == fp8);
  CHECK(g.model.layers.back()->work_floats(rows) == fp8 + rows * C);
  std::vector<std::unique_ptr<LocalParameterStore>> stores;
  std::vector<ParameterStore*> ptrs;
  for (int st = 0; st < s.stages; ++st) {
    stores.push_back(std::make_unique<LocalParameterStore>(g.model, stage_layers(s, g.model, st), 5));
    ptrs.push_back(stores.back().get());
  }
  // A model with FP8 products serves one stage's thread: each stage gets its own.
  std::vector<GptPipeline> own;
  std::vector<const PipelineModel*> models;
  own.reserve(static_cast<std::size_t>(s.stages));  // no reallocation: models point into it
  for (int st = 0; st < s.stages; ++st) {
    own.push_back(gpt_pipeline_model(c, B, s.micro_batches, text.batcher));
    models.push_back(&own.back().model);
  }
  const auto reports = run_stages_as_threads(s, models, ptrs, {}, 1);
  for (int st = 0; st < s.stages; ++st) {
    INFO("stage " << st);
    CHECK(stage_memory(s, st, g.model, pipeline::Remat::never, device::Arena::kAlignment, device::Backend::host)
              .peak_bytes == reports[static_cast<std::size_t>(st)].peak_device_bytes);
  }
}

TEST_CASE("a pipeline stage registers the GPT's own tensors, unit-scaled learning rates included", "[gpt][pipeline]") {
  GptConfig c = small_gpt();
  c.unit_scaled = GENERATE(false, true);
  INFO((c.unit_scaled ? "unit-scaled" : "plain") << " GPT");
  Text text(c.seq_len);
  const auto g = gpt_pipeline_model(c, 2, 1, text.batcher);
  // Every layer on one stage: the tensors `strata train` registers, in its order (the head's
  // tied wte is the embedding layer's), each at its learning-rate scale.
  const auto specs = engine::StageStore::param_specs(g.model, all_layers(g.model));
  const auto want = gpt_params(c.shape, c.unit_scaled, c.seq_len);
  REQUIRE(specs.size() == want.size());
  bool scaled = false;
  for (std::size_t i = 0; i < want.size(); ++i) {
    INFO(want[i].name);
    CHECK(specs[i].name == want[i].name);
    CHECK(specs[i].shape == want[i].shape);
    CHECK(specs[i].layer == want[i].layer);
    CHECK(specs[i].lr_scale == want[i].lr_scale);
    scaled = scaled || want[i].lr_scale != 1.0f;
  }
  CHECK(scaled == c.unit_scaled);
}
