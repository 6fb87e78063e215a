// The GPT as pipeline layers (see pipeline_layers.h).
#include "models/gpt/pipeline_layers.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "engine/layout.h"
#include "models/gpt/block.h"
#include "models/gpt/fp8_products.h"
#include "models/gpt/kernels.h"
#include "models/gpt/ops.h"
#include "models/gpt/unit_scale.h"
#include "runtime/core/error.h"
#include "runtime/device/device.h"

namespace strata::model {
namespace {

std::size_t numel(const GptParam& p) {
  return static_cast<std::size_t>(std::accumulate(p.shape.begin(), p.shape.end(), std::int64_t{1},
                                                  [](std::int64_t a, std::int64_t b) { return a * b; }));
}

// The engine's initial values for the GPT's tensors (engine::init_values keyed by name), so
// a pipelined GPT starts where `strata train` does for the same seed.
void init_tensors(const std::vector<GptParam>& params, float* out, std::uint64_t seed) {
  for (const auto& p : params) {
    const std::size_t n = numel(p);
    engine::init_values(engine::ParamSpec{p.name, p.shape, p.layer, p.init}, seed, 0, n, out);
    out += n;
  }
}

// The embedding's input (one float per token, in device memory) as the host token array the
// kernels take.
std::vector<std::int32_t> token_ids(GptKernels& k, const float* x, std::size_t rows, int vocab) {
  std::vector<float> ids(rows);
  k.to_host(ids.data(), x, rows);
  std::vector<std::int32_t> t(rows);
  for (std::size_t i = 0; i < rows; ++i) {
    // Checked before the conversion, which is undefined for values out of range.
    STRATA_CHECK(ids[i] >= 0.0f && ids[i] < static_cast<float>(vocab) && ids[i] == std::floor(ids[i]),
                 Errc::invalid_argument, "GPT pipeline: input ", i, " is ", ids[i],
                 ", not a token id below the vocabulary's ", vocab);
    t[i] = static_cast<std::int32_t>(ids[i]);
  }
  return t;
}

// What the three layers share: the shape, the micro-batch's sequence length, for the
// unit-scaled GPT its scales (from the training sequence length), the FP8 products and the
// kernels.
struct LayerSetup {
  GptShape shape;
  int seq_len = 1;
  std::shared_ptr<const UnitScales> unit;  // null: the plain GPT
  int train_seq_len = 1;
  std::shared_ptr<Fp8Products> fp8;     // null: the products in the caller's precision
  std::shared_ptr<GptKernels> kernels;  // null: the host kernels
};

class GptLayer : public pipeline::Layer {
 public:
  GptLayer(const LayerSetup& l, int id)
      : s_(l.shape),
        T_(l.seq_len),
        id_(id),
        unit_(l.unit),
        fp8_(l.fp8),
        kernels_(l.kernels),
        k_(l.kernels != nullptr ? *l.kernels : host_kernels()),
        params_(gpt_pipeline_params(l.shape, id, l.unit != nullptr, l.train_seq_len)) {
    for (const auto& p : params_) count_ += numel(p);
  }
  std::size_t param_count() const override { return count_; }
  // saved_floats(rows) as the CUDA kernels run the layer (they keep the attention's
  // probabilities: CudaKernels::keeps_full_scores).
  virtual std::size_t saved_floats_on_cuda(std::size_t rows) const { return saved_floats(rows); }
  // The FP8 products' scratch (Fp8Products::scratch_floats), at the front of `work`.
  std::size_t work_floats(std::size_t rows) const override {
    return fp8_ ? Fp8Products::scratch_floats(s_, rows).total() : 0;
  }
  void init_params(float* params, std::uint64_t seed, int) const override { init_tensors(params_, params, seed); }
  std::vector<Tensor> tensors() const override {
    std::vector<Tensor> out;
    for (const auto& p : params_) out.push_back({p.name, p.shape, p.lr_scale});
    return out;
  }

 protected:
  // Points the FP8 products at this call's work buffer; returns the floats after their scratch.
  float* fp8_scratch(float* work, std::size_t rows) const {
    if (!fp8_) return work;
    const auto f = Fp8Products::scratch_floats(s_, rows);
    fp8_->use_scratch({work, work + f.x, work + f.x + f.w});
    return work + f.total();
  }
  int sequences(std::size_t rows) const {
    STRATA_CHECK(rows % static_cast<std::size_t>(T_) == 0, Errc::invalid_argument, "GPT pipeline: ", rows,
                 " rows are not whole sequences of ", T_, " tokens");
    return static_cast<int>(rows / static_cast<std::size_t>(T_));
  }
  const GptShape s_;
  const int T_, id_;
  const std::shared_ptr<const UnitScales> unit_;
  const std::shared_ptr<Fp8Products> fp8_;     // one replica's stage thread calls it, one action at a time
  const std::shared_ptr<GptKernels> kernels_;  // a stage's own (PipelineModel::bind), or null
  GptKernels& k_;                              // where every operation runs (kernels.h)
  const std::vector<GptParam> params_;
  std::size_t count_ = 0;
};

class Embedding final : public GptLayer {
 public:
  explicit Embedding(const LayerSetup& l) : GptLayer(l, 0) {}
  std::string name() const override { return "gpt.embedding"; }
  std::size_t in_features() const override { return 1; }
  std::size_t out_features() const override { return static_cast<std::size_t>(s_.d_model); }
  // Unit-scaled: the gradient scaled (the GPT's pass scales its own in place; dy is the executor's).
  std::size_t work_floats(std::size_t rows) const override { return unit_ ? rows * out_features() : 0; }
  void forward(const float* p, const float* x, float* y, float*, float*, std::size_t rows) const override {
    const auto t = token_ids(k_, x, rows, s_.vocab);
    k_.embedding_forward(y, t.data(), p, p + wpe_at(), sequences(rows), T_, s_.d_model);
    if (unit_) k_.scale(y, UnitScales::embedding(), rows * out_features());
  }
  void backward_input(const float*, const float*, float*, const float*, float* dx, float*,
                      std::size_t rows) const override {
    k_.zero(dx, rows);
  }
  void backward_weight(const float*, const float* x, const float*, const float* dy, float* dp, float* work,
                       std::size_t rows) const override {
    const auto t = token_ids(k_, x, rows, s_.vocab);
    k_.zero(dp, count_);
    if (unit_) {
      k_.copy(work, dy, rows * out_features());
      k_.scale(work, UnitScales::embedding(), rows * out_features());
      dy = work;
    }
    k_.embedding_backward(dp, dp + wpe_at(), dy, t.data(), sequences(rows), T_, s_.d_model);
  }

 private:
  std::size_t wpe_at() const { return static_cast<std::size_t>(s_.vocab) * static_cast<std::size_t>(s_.d_model); }
};

class Block final : public GptLayer {
 public:
  Block(const LayerSetup& l, int id, ops::Products p) : GptLayer(l, id), products_(p) {
    std::size_t at = 0;
    for (std::size_t k = 0; k < kBlockParams; ++k) {
      offset_[k] = at;
      at += numel(params_[k]);
    }
  }
  std::string name() const override { return "gpt.block" + std::to_string(id_ - 1); }
  std::size_t in_features() const override { return static_cast<std::size_t>(s_.d_model); }
  std::size_t out_features() const override { return static_cast<std::size_t>(s_.d_model); }
  std::size_t saved_floats(std::size_t rows) const override { return saved(dims(rows)); }
  std::size_t saved_floats_on_cuda(std::size_t rows) const override {
    BlockDims d = dims(rows);
    d.full_scores = true;
    return saved(d);
  }
  void forward(const float* p, const float* x, float* y, float* saved, float* work, std::size_t rows) const override {
    fp8_scratch(work, rows);
    const BlockDims d = dims(rows);
    block_forward(y, x, weights(p), acts(saved, d), d);
  }
  void backward_input(const float* p, const float* x, float* saved, const float* dy, float* dx, float* work,
                      std::size_t rows) const override {
    fp8_scratch(work, rows);
    const BlockDims d = dims(rows);
    k_.copy(dx, dy, rows * in_features());
    block_backward_input(dx, x, weights(p), acts(saved, d), split(saved, d), d);
  }
  void backward_weight(const float*, const float* x, const float* saved, const float* dy, float* dp, float* work,
                       std::size_t rows) const override {
    fp8_scratch(work, rows);
    const BlockDims d = dims(rows);
    k_.zero(dp, count_);
    BlockGrads g{};
    for (std::size_t k = 0; k < kBlockParams; ++k) g[k] = dp + offset_[k];
    auto* s = const_cast<float*>(saved);  // read only: carve() hands out mutable views
    block_backward_weight(g, dy, x, acts(s, d), split(s, d), d);
  }

 private:
  static std::size_t saved(const BlockDims& d) { return BlockActs::floats(d) + BlockSplit::floats(d); }
  BlockDims dims(std::size_t rows) const {
    BlockDims d;
    d.B = sequences(rows);
    d.T = T_;
    d.C = s_.d_model;
    d.NH = s_.heads;
    d.block = id_ - 1;
    d.products = products_;
    d.fp8 = fp8_.get();
    d.unit = unit_.get();
    d.kernels = &k_;
    d.full_scores = k_.keeps_full_scores();
    return d;
  }
  BlockWeights weights(const float* p) const {
    BlockWeights w{};
    for (std::size_t k = 0; k < kBlockParams; ++k) w[k] = p + offset_[k];
    return w;
  }
  static BlockActs acts(float* saved, const BlockDims& d) {
    BlockActs a{};
    a.carve(saved, d);
    return a;
  }
  static BlockSplit split(float* saved, const BlockDims& d) {
    BlockSplit k{};
    k.carve(saved + BlockActs::floats(d), d);
    return k;
  }
  std::array<std::size_t, kBlockParams> offset_{};
  ops::Products products_;
};

// ln_f then logits = ln_f(x) wte^T; saves ln_f's output, mean and rstd.
class Head final : public GptLayer {
 public:
  Head(const LayerSetup& l, ops::Products p) : GptLayer(l, l.shape.layers + 1), products_(p) {}
  std::string name() const override { return "gpt.head"; }
  std::size_t in_features() const override { return static_cast<std::size_t>(s_.d_model); }
  std::size_t out_features() const override { return static_cast<std::size_t>(s_.vocab); }
  std::size_t saved_floats(std::size_t rows) const override { return rows * (in_features() + 2); }
  // The FP8 scratch, then the gradient at ln_f's output.
  std::size_t work_floats(std::size_t rows) const override {
    return GptLayer::work_floats(rows) + rows * in_features();
  }
  bool splits_backward() const override { return false; }
  void forward(const float* p, const float* x, float* y, float* saved, float* work, std::size_t rows) const override {
    fp8_scratch(work, rows);
    const int N = static_cast<int>(rows), C = s_.d_model;
    k_.layernorm_forward(saved, saved + rows * C, saved + rows * (C + 1), x, p, p + C, N, C);
    if (fp8_) {
      fp8_->head_forward(y, saved, p + 2 * C, N, C, s_.vocab, scales());
    } else {
      k_.lm_head_forward(y, saved, p + 2 * C, N, C, s_.vocab, products_, scales());
    }
  }
  void backward_input(const float*, const float*, float*, const float*, float*, float*, std::size_t) const override {
    STRATA_THROW(Errc::internal, "the GPT's head does not split its backward");
  }
  void backward_weight(const float*, const float*, const float*, const float*, float*, float*,
                       std::size_t) const override {
    STRATA_THROW(Errc::internal, "the GPT's head does not split its backward");
  }
  void backward(const float* p, const float* x, float* saved, const float* dy, float* dx, float* dp, float* work,
                std::size_t rows) const override {
    const int N = static_cast<int>(rows), C = s_.d_model;
    k_.zero(dp, count_);
    float* dln = fp8_scratch(work, rows);
    if (fp8_) {
      fp8_->head_backward(dln, dp + 2 * C, dy, saved, p + 2 * C, N, C, s_.vocab, scales());
    } else {
      k_.lm_head_backward(dln, dp + 2 * C, dy, saved, p + 2 * C, N, C, s_.vocab, products_, scales());
    }
    k_.zero(dx, rows * static_cast<std::size_t>(C));
    k_.layernorm_backward(dx, dp, dp + C, dln, x, p, saved + rows * C, saved + rows * (C + 1), N, C);
  }

 private:
  ops::ProductScales scales() const { return unit_ ? unit_->head() : ops::ProductScales{}; }
  ops::Products products_;
};

std::vector<std::shared_ptr<const pipeline::Layer>> gpt_layers(const LayerSetup& l, ops::Products products) {
  std::vector<std::shared_ptr<const pipeline::Layer>> out;
  out.push_back(std::make_shared<Embedding>(l));
  for (int b = 1; b <= l.shape.layers; ++b) out.push_back(std::make_shared<Block>(l, b, products));
  out.push_back(std::make_shared<Head>(l, products));
  return out;
}

}  // namespace

std::vector<GptParam> gpt_pipeline_params(const GptShape& shape, int layer, bool unit_scaled, int seq_len) {
  STRATA_CHECK(layer >= 0 && layer <= shape.layers + 1, Errc::invalid_argument, "GPT pipeline: layer ", layer,
               " is not one of the ", shape.layers + 2, " (embeddings, ", shape.layers, " blocks, head)");
  std::vector<GptParam> out;
  const auto all = gpt_params(shape, unit_scaled, seq_len);
  for (const auto& p : all)
    if (p.layer == layer) out.push_back(p);
  if (layer == shape.layers + 1) out.push_back(all.front());  // the head reads wte again
  return out;
}

GptPipeline gpt_pipeline_model(const GptConfig& c, int micro_batch, int micro_batches,
                               std::shared_ptr<const Batcher> batcher, int rank, int world, ops::Products products,
                               int seq_len) {
  validate(c);
  STRATA_CHECK(seq_len >= 0 && seq_len <= c.seq_len, Errc::invalid_argument, "GPT pipeline: sequences of ", seq_len,
               " tokens; the model trains at ", c.seq_len);
  STRATA_CHECK(micro_batch >= 1 && micro_batches >= 1 && batcher != nullptr, Errc::invalid_argument,
               "GPT pipeline: micro-batch size ", micro_batch, " and ", micro_batches,
               " micro-batches must be at least 1, with a batcher");
  const GptShape& s = c.shape;
  const int T = seq_len > 0 ? seq_len : c.seq_len, B = micro_batch;
  LayerSetup l{s,         T,       c.unit_scaled ? std::make_shared<const UnitScales>(s, c.seq_len) : nullptr,
               c.seq_len, nullptr, nullptr};
  GptPipeline g;
  if (c.fp8.enabled) {
    l.fp8 = std::make_shared<Fp8Products>(c.fp8, s, Fp8Products::Scratch{});  // scratch: each call's work
    g.fp8 = l.fp8;
  }
  g.losses = std::make_shared<std::vector<double>>(static_cast<std::size_t>(micro_batches), 0.0);
  auto& m = g.model;
  m.rows = static_cast<std::size_t>(B) * static_cast<std::size_t>(T);
  m.layers = gpt_layers(l, products);
  // A CUDA stage's layers: the same, on kernels bound to its stream, their scratch sized
  // for this model's micro-batches.
  const std::size_t att = static_cast<std::size_t>(B) * static_cast<std::size_t>(s.heads) *
                          static_cast<std::size_t>(T) * static_cast<std::size_t>(T);
  m.bind_bytes = cuda_scratch_bytes(B * T, att);
  m.bind = [l, products, tokens = B * T, att](device::Device& dev, device::Stream& stream) {
    STRATA_CHECK(l.fp8 == nullptr, Errc::unsupported, "GPT pipeline stage on ", dev.name(),
                 ": the FP8 products of pipelined layers run on host-device stages only; drop the fp8 block, or "
                 "pipeline on the host device");
    LayerSetup bound = l;
    bound.kernels = make_kernels(dev, tokens, att, &stream);
    return gpt_layers(bound, products);
  };
  m.bound_saved_floats = [layers = m.layers](int id, std::size_t rows) {
    return dynamic_cast<const GptLayer&>(*layers[static_cast<std::size_t>(id)]).saved_floats_on_cuda(rows);
  };
  m.tie = pipeline::Tie{0, 0, s.layers + 1, static_cast<std::size_t>(s.vocab) * static_cast<std::size_t>(s.d_model)};
  const std::int64_t global = static_cast<std::int64_t>(B) * micro_batches * world;
  const std::size_t n = m.rows;
  m.input = [=](std::int64_t step, int micro, float* x) {
    std::vector<std::int32_t> in(n), tg(n);
    batcher->train_batch(step, global, micro, world, rank, B, in.data(), tg.data());
    for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<float>(in[i]);
  };
  // The gradient of each micro-batch's mean token loss (unit-scaled: unit_scale.h's) times
  // the loss scale, as the GPT's pass hands the engine (which averages over micro-batches
  // and ranks, and divides by the scale).
  auto losses = g.losses;
  const int V = s.vocab;
  const bool unit = l.unit != nullptr;
  const float unit_grad = unit ? l.unit->loss_grad() : 0.0f;
  m.loss_grad = [=](std::int64_t step, int micro, const float* y, float* dy, float loss_scale) {
    const float scale = unit ? loss_scale * unit_grad : loss_scale / static_cast<float>(n);
    std::vector<std::int32_t> in(n), tg(n);
    batcher->train_batch(step, global, micro, world, rank, B, in.data(), tg.data());
    std::vector<float> row_loss(n);
    std::copy(y, y + n * static_cast<std::size_t>(V), dy);
    (*losses)[static_cast<std::size_t>(micro)] =
        ops::cross_entropy(dy, row_loss.data(), tg.data(), static_cast<int>(n), V, scale);
  };
  g.val_input = [=](int v, float* x) {
    std::vector<std::int32_t> in(n), tg(n);
    batcher->val_batch(v, B, in.data(), tg.data());
    for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<float>(in[i]);
  };
  // The loss alone, as the GPT's evaluate() computes it (cross-entropy at gradient scale 0).
  g.val_loss = [=](int v, const float* logits) {
    std::vector<std::int32_t> in(n), tg(n);
    batcher->val_batch(v, B, in.data(), tg.data());
    std::vector<float> scratch(logits, logits + n * static_cast<std::size_t>(V)), row_loss(n);
    return ops::cross_entropy(scratch.data(), row_loss.data(), tg.data(), static_cast<int>(n), V, 0.0f);
  };
  return g;
}

}  // namespace strata::model
