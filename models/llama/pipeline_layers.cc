// A Llama-family decoder as pipeline layers (see pipeline_layers.h).
#include "models/llama/pipeline_layers.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>

#include "engine/layout.h"
#include "models/gpt/ops.h"
#include "models/llama/block.h"
#include "models/llama/ops.h"
#include "runtime/core/error.h"

namespace strata::model {
namespace {

std::size_t numel(const LlamaParam& p) {
  return static_cast<std::size_t>(std::accumulate(p.shape.begin(), p.shape.end(), std::int64_t{1},
                                                  [](std::int64_t a, std::int64_t b) { return a * b; }));
}

// The embedding's input (one float per token, host memory: these layers run on host
// devices only) as token ids, each checked before the conversion (undefined out of range).
std::vector<std::int32_t> token_ids(const float* x, std::size_t rows, int vocab) {
  std::vector<std::int32_t> t(rows);
  for (std::size_t i = 0; i < rows; ++i) {
    STRATA_CHECK(x[i] >= 0.0f && x[i] < static_cast<float>(vocab) && x[i] == std::floor(x[i]), Errc::invalid_argument,
                 "Llama pipeline: input ", i, " is ", x[i], ", not a token id below the vocabulary's ", vocab);
    t[i] = static_cast<std::int32_t>(x[i]);
  }
  return t;
}

// What the layers share: the shape, the micro-batch's sequence length, the weight products'
// precision and the rotary tables of the training length (a shorter sequence reads their
// first rows, as the plain pass does).
struct LayerSetup {
  LlamaShape shape;
  int seq_len = 1;
  ops::Products products = ops::Products::fp32;
  std::shared_ptr<const std::vector<float>> cos, sin;
};

class LlamaLayer : public pipeline::Layer {
 public:
  LlamaLayer(std::shared_ptr<const LayerSetup> l, int id)
      : l_(std::move(l)), s_(l_->shape), T_(l_->seq_len), id_(id), params_(llama_pipeline_params(s_, id)) {
    for (const auto& p : params_) count_ += numel(p);
  }
  std::size_t param_count() const override { return count_; }
  void init_params(float* out, std::uint64_t seed, int) const override {
    for (const auto& p : params_) {
      const std::size_t n = numel(p);
      engine::init_values(engine::ParamSpec{p.name, p.shape, p.layer, p.init}, seed, 0, n, out);
      out += n;
    }
  }
  std::vector<Tensor> tensors() const override {
    std::vector<Tensor> out;
    for (const auto& p : params_) out.push_back({p.name, p.shape, 1.0f});
    return out;
  }

 protected:
  int sequences(std::size_t rows) const {
    STRATA_CHECK(rows % static_cast<std::size_t>(T_) == 0, Errc::invalid_argument, "Llama pipeline: ", rows,
                 " rows are not whole sequences of ", T_, " tokens");
    return static_cast<int>(rows / static_cast<std::size_t>(T_));
  }
  std::size_t hidden() const { return static_cast<std::size_t>(s_.hidden); }
  const std::shared_ptr<const LayerSetup> l_;
  const LlamaShape& s_;
  const int T_, id_;
  const std::vector<LlamaParam> params_;
  std::size_t count_ = 0;
};

class Embedding final : public LlamaLayer {
 public:
  explicit Embedding(std::shared_ptr<const LayerSetup> l) : LlamaLayer(std::move(l), 0) {}
  std::string name() const override { return "llama.embedding"; }
  std::size_t in_features() const override { return 1; }
  std::size_t out_features() const override { return hidden(); }
  void forward(const float* p, const float* x, float* y, float*, float*, std::size_t rows) const override {
    const auto t = token_ids(x, rows, s_.vocab);
    llama::embedding_forward(y, t.data(), p, static_cast<int>(rows), s_.hidden);
  }
  void backward_input(const float*, const float*, float*, const float*, float* dx, float*,
                      std::size_t rows) const override {
    std::fill(dx, dx + rows, 0.0f);
  }
  void backward_weight(const float*, const float* x, const float*, const float* dy, float* dp, float*,
                       std::size_t rows) const override {
    const auto t = token_ids(x, rows, s_.vocab);
    std::fill(dp, dp + count_, 0.0f);
    llama::embedding_backward(dp, dy, t.data(), static_cast<int>(rows), s_.hidden);
  }
};

class Block final : public LlamaLayer {
 public:
  Block(std::shared_ptr<const LayerSetup> l, int id) : LlamaLayer(std::move(l), id) {
    const auto slots = llama_block_slots(s_);
    std::size_t at = 0;
    for (std::size_t k = 0; k < slots.size(); ++k) {
      offset_[slots[k]] = at;
      present_[slots[k]] = true;
      at += numel(params_[k]);
    }
  }
  std::string name() const override { return "llama.block" + std::to_string(id_ - 1); }
  std::size_t in_features() const override { return hidden(); }
  std::size_t out_features() const override { return hidden(); }
  // The activations, then what the input pass keeps for the weight pass (LlamaSplit).
  std::size_t saved_floats(std::size_t rows) const override {
    const LlamaDims d = dims(rows);
    return LlamaActs::floats(d) + LlamaSplit::floats(d);
  }
  // The input pass's temporaries (LlamaScratch: dact and dy).
  std::size_t work_floats(std::size_t rows) const override { return LlamaScratch::floats(dims(rows)); }
  void forward(const float* p, const float* x, float* y, float* saved, float*, std::size_t rows) const override {
    const LlamaDims d = dims(rows);
    llama_block_forward(y, x, weights(p), acts(saved, d), d);
  }
  // dx starts as dy (the block's dres).
  void backward_input(const float* p, const float* x, float* saved, const float* dy, float* dx, float* work,
                      std::size_t rows) const override {
    const LlamaDims d = dims(rows);
    std::copy(dy, dy + rows * hidden(), dx);
    LlamaScratch sc{};
    sc.carve(work, d);
    llama_block_backward_input(dx, x, weights(p), acts(saved, d), split(saved, d), sc, d);
  }
  // The gradients from zero: the plain pass's per micro-batch accumulators start at zero too.
  void backward_weight(const float*, const float* x, const float* saved, const float* dy, float* dp, float*,
                       std::size_t rows) const override {
    const LlamaDims d = dims(rows);
    std::fill(dp, dp + count_, 0.0f);
    LlamaGrads g{};
    for (std::size_t k = 0; k < kLlamaSlots; ++k) g[k] = present_[k] ? dp + offset_[k] : nullptr;
    auto* s = const_cast<float*>(saved);  // read only: carve() hands out mutable views
    llama_block_backward_weight(g, dy, x, acts(s, d), split(s, d), d);
  }

 private:
  LlamaDims dims(std::size_t rows) const {
    return {sequences(rows), T_, &s_, l_->cos->data(), l_->sin->data(), l_->products};
  }
  LlamaWeights weights(const float* p) const {
    LlamaWeights w{};
    for (std::size_t k = 0; k < kLlamaSlots; ++k) w[k] = present_[k] ? p + offset_[k] : nullptr;
    return w;
  }
  static LlamaActs acts(float* saved, const LlamaDims& d) {
    LlamaActs a{};
    a.carve(saved, d);
    return a;
  }
  static LlamaSplit split(float* saved, const LlamaDims& d) {
    LlamaSplit k{};
    k.carve(saved + LlamaActs::floats(d), d);
    return k;
  }
  std::array<std::size_t, kLlamaSlots> offset_{};
  std::array<bool, kLlamaSlots> present_{};
};

// The final RMSNorm, then logits = norm(x) W^T with W lm_head.weight or (tied) the
// embedding; saves the normed rows and their rstd. Does not split: a tied head's gradient
// must leave in B (pipeline/model.h: Tie).
class Head final : public LlamaLayer {
 public:
  explicit Head(std::shared_ptr<const LayerSetup> l) : LlamaLayer(l, l->shape.layers + 1) {}
  std::string name() const override { return "llama.head"; }
  std::size_t in_features() const override { return hidden(); }
  std::size_t out_features() const override { return static_cast<std::size_t>(s_.vocab); }
  std::size_t saved_floats(std::size_t rows) const override { return rows * (hidden() + 1); }
  // The gradient at the norm's output.
  std::size_t work_floats(std::size_t rows) const override { return rows * hidden(); }
  bool splits_backward() const override { return false; }
  void forward(const float* p, const float* x, float* y, float* saved, float*, std::size_t rows) const override {
    const int N = static_cast<int>(rows), C = s_.hidden;
    llama::rmsnorm_forward(saved, saved + rows * hidden(), x, p, N, C, static_cast<float>(s_.rms_eps));
    ops::lm_head_forward(y, saved, p + C, N, C, s_.vocab, l_->products);
  }
  void backward_input(const float*, const float*, float*, const float*, float*, float*, std::size_t) const override {
    STRATA_THROW(Errc::internal, "the Llama's head does not split its backward");
  }
  void backward_weight(const float*, const float*, const float*, const float*, float*, float*,
                       std::size_t) const override {
    STRATA_THROW(Errc::internal, "the Llama's head does not split its backward");
  }
  void backward(const float* p, const float* x, float* saved, const float* dy, float* dx, float* dp, float* work,
                std::size_t rows) const override {
    const int N = static_cast<int>(rows), C = s_.hidden;
    std::fill(dp, dp + count_, 0.0f);
    ops::lm_head_backward(work, dp + C, dy, saved, p + C, N, C, s_.vocab, l_->products);
    llama::rmsnorm_backward(dx, dp, work, x, p, saved + rows * hidden(), N, C, false);
  }
};

std::vector<std::shared_ptr<const pipeline::Layer>> llama_layers(const std::shared_ptr<const LayerSetup>& l) {
  std::vector<std::shared_ptr<const pipeline::Layer>> out;
  out.push_back(std::make_shared<Embedding>(l));
  for (int b = 1; b <= l->shape.layers; ++b) out.push_back(std::make_shared<Block>(l, b));
  out.push_back(std::make_shared<Head>(l));
  return out;
}

}  // namespace

std::vector<LlamaParam> llama_pipeline_params(const LlamaShape& shape, int layer) {
  STRATA_CHECK(layer >= 0 && layer <= shape.layers + 1, Errc::invalid_argument, "Llama pipeline: layer ", layer,
               " is not one of the ", shape.layers + 2, " (embedding, ", shape.layers, " blocks, head)");
  std::vector<LlamaParam> out;
  const auto all = llama_params(shape);
  for (const auto& p : all)
    if (p.layer == layer) out.push_back(p);
  if (layer == shape.layers + 1 && shape.tied) out.push_back(all.front());  // the head reads the embedding
  return out;
}

LlamaPipeline llama_pipeline_model(const LlamaShape& s, int train_seq_len, int micro_batch, int micro_batches,
                                   std::shared_ptr<const Batcher> batcher, int rank, int world, ops::Products products,
                                   int seq_len) {
  STRATA_CHECK(train_seq_len >= 1 && seq_len >= 0 && seq_len <= train_seq_len, Errc::invalid_argument,
               "Llama pipeline: sequences of ", seq_len, " tokens; the model trains at ", train_seq_len);
  STRATA_CHECK(micro_batch >= 1 && micro_batches >= 1 && batcher != nullptr, Errc::invalid_argument,
               "Llama pipeline: micro-batch size ", micro_batch, " and ", micro_batches,
               " micro-batches must be at least 1, with a batcher");
  validate_seq_len(s, train_seq_len);
  const int T = seq_len > 0 ? seq_len : train_seq_len, B = micro_batch;
  auto setup = std::make_shared<LayerSetup>();
  setup->shape = s;
  setup->seq_len = T;
  setup->products = products;
  {
    const std::size_t half = static_cast<std::size_t>(train_seq_len) * static_cast<std::size_t>(s.head_dim / 2);
    auto cos = std::make_shared<std::vector<float>>(half), sin = std::make_shared<std::vector<float>>(half);
    llama::rope_tables(cos->data(), sin->data(), rope_inv_freq(s), train_seq_len);
    setup->cos = std::move(cos);
    setup->sin = std::move(sin);
  }
  LlamaPipeline g;
  g.losses = std::make_shared<std::vector<double>>(static_cast<std::size_t>(micro_batches), 0.0);
  auto& m = g.model;
  m.rows = static_cast<std::size_t>(B) * static_cast<std::size_t>(T);
  m.layers = llama_layers(setup);
  if (s.tied)
    m.tie = pipeline::Tie{0, 0, s.layers + 1, static_cast<std::size_t>(s.vocab) * static_cast<std::size_t>(s.hidden)};
  const std::int64_t global = static_cast<std::int64_t>(B) * micro_batches * world;
  const std::size_t n = m.rows;
  m.input = [=](std::int64_t step, int micro, float* x) {
    std::vector<std::int32_t> in(n), tg(n);
    batcher->train_batch(step, global, micro, world, rank, B, in.data(), tg.data());
    for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<float>(in[i]);
  };
  // The gradient of each micro-batch's mean token loss times the loss scale, as the Llama's
  // pass hands the engine (which averages over micro-batches and ranks, and divides by the scale).
  auto losses = g.losses;
  const int V = s.vocab;
  m.loss_grad = [=](std::int64_t step, int micro, const float* y, float* dy, float loss_scale) {
    std::vector<std::int32_t> in(n), tg(n);
    batcher->train_batch(step, global, micro, world, rank, B, in.data(), tg.data());
    std::vector<float> row_loss(n);
    std::copy(y, y + n * static_cast<std::size_t>(V), dy);
    (*losses)[static_cast<std::size_t>(micro)] =
        ops::cross_entropy(dy, row_loss.data(), tg.data(), static_cast<int>(n), V, loss_scale / static_cast<float>(n));
  };
  g.val_input = [=](int v, float* x) {
    std::vector<std::int32_t> in(n), tg(n);
    batcher->val_batch(v, B, in.data(), tg.data());
    for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<float>(in[i]);
  };
  // The loss alone, as the Llama's evaluate() computes it (cross-entropy at gradient scale 0).
  g.val_loss = [=](int v, const float* logits) {
    std::vector<std::int32_t> in(n), tg(n);
    batcher->val_batch(v, B, in.data(), tg.data());
    std::vector<float> scratch(logits, logits + n * static_cast<std::size_t>(V)), row_loss(n);
    return ops::cross_entropy(scratch.data(), row_loss.data(), tg.data(), static_cast<int>(n), V, 0.0f);
  };
  return g;
}

}  // namespace strata::model
