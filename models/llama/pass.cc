// A Llama-family decoder's forward and backward over one micro-batch (see pass.h).
#include "models/llama/pass.h"

#include <algorithm>
#include <vector>

#include "models/llama/kernels.h"
#include "models/llama/ops.h"
#include "runtime/core/error.h"
#include "runtime/device/device.h"

namespace strata::model {
namespace {

struct Sizes {
  std::size_t xs, acts_each, sets, scratch, nc, n, logits, rope;
  std::size_t total() const { return xs + acts_each * sets + scratch + 3 * nc + 2 * n + logits + rope; }
};

Sizes sizes(const LlamaShape& s, const LlamaDims& d, Remat r, bool cuda) {
  Sizes z{};
  z.n = d.tokens();
  z.nc = z.n * static_cast<std::size_t>(s.hidden);
  z.xs = static_cast<std::size_t>(s.layers + 1) * z.nc;
  z.acts_each = LlamaActs::floats(d);
  z.sets = static_cast<std::size_t>(remat_act_sets(r, s.layers));
  z.scratch = LlamaScratch::floats(d);
  z.logits = head_chunk_rows(z.n, d.B, s.vocab, cuda) * static_cast<std::size_t>(s.vocab);
  z.rope = static_cast<std::size_t>(d.T) * static_cast<std::size_t>(s.head_dim);  // cos and sin
  return z;
}

std::size_t att_floats(const LlamaShape& s, const LlamaDims& d) {
  return d.tokens() * static_cast<std::size_t>(s.heads) * static_cast<std::size_t>(d.T);
}

LlamaWeights by_slot(const LlamaShape& s, const std::vector<const float*>& v) {
  LlamaWeights w{};
  const auto slots = llama_block_slots(s);
  for (std::size_t i = 0; i < slots.size(); ++i) w[slots[i]] = v.at(i);
  return w;
}

LlamaGrads by_slot(const LlamaShape& s, const std::vector<float*>& v) {
  LlamaGrads g{};
  const auto slots = llama_block_slots(s);
  for (std::size_t i = 0; i < slots.size(); ++i) g[slots[i]] = v.at(i);
  return g;
}

}  // namespace

struct LlamaPass::Buffers {
  device::DeviceBuffer mem;
  float* xs = nullptr;  // the residual stream: block l's input at l * NC
  std::vector<LlamaActs> acts;
  LlamaScratch scratch{};
  float *dres = nullptr, *normed = nullptr, *rstd = nullptr, *logits = nullptr, *losses = nullptr, *cos = nullptr,
        *sin = nullptr, *dnormed = nullptr;
};

std::uint64_t LlamaPass::device_bytes(const LlamaShape& shape, int max_batch, int max_seq, Remat remat, bool cuda) {
  LlamaDims d{max_batch, max_seq, &shape};
  d.full_scores = cuda;
  const std::uint64_t scratch = cuda ? llama_cuda_scratch_bytes(static_cast<int>(d.tokens()), att_floats(shape, d)) : 0;
  return sizes(shape, d, remat, cuda).total() * sizeof(float) + scratch;
}

LlamaPass::LlamaPass(const LlamaShape& shape, int max_batch, int max_seq, Remat remat, device::Device& dev,
                     ops::Products products)
    : shape_(shape),
      remat_(remat),
      products_(products),
      max_B_(max_batch),
      max_T_(max_seq),
      dev_(dev),
      buf_(std::make_unique<Buffers>()) {
  LlamaDims d{max_B_, max_T_, &shape_};
  k_ = make_llama_kernels(dev, static_cast<int>(d.tokens()), att_floats(shape_, d));
  d.full_scores = k_->keeps_full_scores();
  const bool cuda = dev.backend() == device::Backend::cuda;
  const Sizes z = sizes(shape_, d, remat_, cuda);
  head_rows_ = static_cast<int>(head_chunk_rows(d.tokens(), max_B_, shape_.vocab, cuda));
  auto& b = *buf_;
  b.mem = device::DeviceBuffer(dev, z.total() * sizeof(float), "llama activations");
  float* p = b.mem.as<float>();
  auto take = [&p](std::size_t n) {
    float* r = p;
    p += n;
    return r;
  };
  b.xs = take(z.xs);
  b.acts.resize(z.sets);
  for (auto& a : b.acts) a.carve(take(z.acts_each), d);
  b.scratch.carve(take(z.scratch), d);
  b.dres = take(z.nc);
  b.normed = take(z.nc);
  b.dnormed = take(z.nc);
  b.rstd = take(z.n);
  b.losses = take(z.n);
  b.logits = take(z.logits);
  b.cos = take(z.rope / 2);
  b.sin = take(z.rope / 2);
  // Made on the host, uploaded once (on a CUDA device, before any pass reads them).
  std::vector<float> tables(z.rope);
  llama::rope_tables(tables.data(), tables.data() + z.rope / 2, rope_inv_freq(shape_), max_T_);
  device::CpuAccessScope cpu(dev_);
  k_->upload(b.cos, tables.data(), z.rope);
}

LlamaPass::~LlamaPass() = default;

LlamaKernels& LlamaPass::kernels() noexcept { return *k_; }

int LlamaPass::act_set(int block) const noexcept { return remat_act_set(remat_, block, shape_.layers); }

bool LlamaPass::recompute(int block) const noexcept { return remat_recomputes(remat_, block, shape_.layers); }

LlamaDims LlamaPass::dims(int B, int T) const {
  STRATA_CHECK(B >= 1 && B <= max_B_ && T >= 1 && T <= max_T_, Errc::invalid_argument, "llama: batch ", B, " x ", T,
               " is larger than the pass was sized for (", max_B_, " x ", max_T_, ")");
  return {B, T, &shape_, buf_->cos, buf_->sin, products_, k_.get(), k_->keeps_full_scores()};
}

void LlamaPass::forward_blocks(LayerAccess& access, const std::int32_t* tokens, const LlamaDims& d, bool keep) {
  auto& b = *buf_;
  const std::size_t NC = d.tokens() * static_cast<std::size_t>(shape_.hidden);
  {
    const auto w = access.acquire(0);
    k_->embedding_forward(b.xs, tokens, w[0], static_cast<int>(d.tokens()), shape_.hidden);
    access.release(0);
  }
  for (int l = 0; l < shape_.layers; ++l) {
    const auto w = access.acquire(l + 1);
    llama_block_forward(b.xs + static_cast<std::size_t>(l + 1) * NC, b.xs + static_cast<std::size_t>(l) * NC,
                        by_slot(shape_, w), b.acts[static_cast<std::size_t>(keep ? act_set(l) : 0)], d);
    access.release(l + 1);
  }
}

double LlamaPass::head(LayerAccess& access, const float* x, int rows, const std::int32_t* targets, float grad_scale,
                       bool backward, float* logits_out) {
  auto& b = *buf_;
  const int L = shape_.layers, C = shape_.hidden, V = shape_.vocab;
  const auto wf = access.acquire(L + 1);
  std::vector<const float*> we;
  if (shape_.tied) we = access.acquire(0);
  const float* W = shape_.tied ? we[0] : wf[1];
  GptKernels& g = k_->gpt();
  k_->rmsnorm_forward(b.normed, b.rstd, x, wf[0], rows, C, static_cast<float>(shape_.rms_eps));
  // The head's weight gradient: the embedding's (tied) or lm_head.weight's.
  std::vector<float*> gf;
  float* dW = nullptr;
  if (backward) {
    if (!shape_.tied) gf = access.grads(L + 1);
    dW = shape_.tied ? access.grads(0)[0] : gf[1];
  }
  // The logits, the loss and the head's gradients chunk by chunk of head_rows_ rows
  // (head_chunk_rows): dW sums the chunks in order.
  double loss = 0.0;
  for (int r0 = 0; r0 < rows; r0 += head_rows_) {
    const int n = std::min(head_rows_, rows - r0);
    const float* in = b.normed + static_cast<std::size_t>(r0) * C;
    g.lm_head_forward(b.logits, in, W, n, C, V, products_, {});
    if (logits_out != nullptr) {
      g.to_host(logits_out + static_cast<std::size_t>(r0) * V, b.logits, static_cast<std::size_t>(n) * V);
      continue;
    }
    loss += g.cross_entropy(b.logits, b.losses + r0, targets + r0, n, V, grad_scale);
    if (backward)
      g.lm_head_backward(b.dnormed + static_cast<std::size_t>(r0) * C, dW, b.logits, in, W, n, C, V, products_, {});
  }
  if (backward) {
    if (shape_.tied) {
      access.release(0);
      gf = access.grads(L + 1);
    }
    k_->rmsnorm_backward(b.dres, gf[0], b.dnormed, x, wf[0], b.rstd, rows, C, false);
    access.commit(L + 1);
  } else if (shape_.tied) {
    access.release(0);
  }
  access.release(L + 1);
  return loss;
}

double LlamaPass::train(LayerAccess& access, const std::int32_t* tokens, const std::int32_t* targets, int B, int T,
                        float loss_scale) {
  const LlamaDims d = dims(B, T);
  device::CpuAccessScope cpu(dev_);
  auto& b = *buf_;
  const std::size_t NC = d.tokens() * static_cast<std::size_t>(shape_.hidden);
  const int L = shape_.layers;
  forward_blocks(access, tokens, d, true);
  const double loss = head(access, b.xs + static_cast<std::size_t>(L) * NC, static_cast<int>(d.tokens()), targets,
                           loss_scale / static_cast<float>(d.tokens()), true, nullptr);
  for (int l = L - 1; l >= 0; --l) {
    const auto w = by_slot(shape_, access.acquire(l + 1));
    const LlamaActs& a = b.acts[static_cast<std::size_t>(act_set(l))];
    float* x = b.xs + static_cast<std::size_t>(l) * NC;
    if (recompute(l)) llama_block_forward(x + NC, x, w, a, d);
    llama_block_backward(b.dres, x, w, by_slot(shape_, access.grads(l + 1)), a, b.scratch, d);
    access.commit(l + 1);
    access.release(l + 1);
  }
  access.acquire(0);
  const auto g0 = access.grads(0);
  k_->embedding_backward(g0[0], b.dres, tokens, static_cast<int>(d.tokens()), shape_.hidden);
  access.commit(0);
  access.release(0);
  return loss;
}

double LlamaPass::loss(LayerAccess& access, const std::int32_t* tokens, const std::int32_t* targets, int B, int T) {
  const LlamaDims d = dims(B, T);
  device::CpuAccessScope cpu(dev_);
  forward_blocks(access, tokens, d, false);
  const std::size_t NC = d.tokens() * static_cast<std::size_t>(shape_.hidden);
  return head(access, buf_->xs + static_cast<std::size_t>(shape_.layers) * NC, static_cast<int>(d.tokens()), targets,
              0.0f, false, nullptr);
}

void LlamaPass::last_logits(LayerAccess& access, const std::int32_t* tokens, int B, int T, float* out) {
  const LlamaDims d = dims(B, T);
  device::CpuAccessScope cpu(dev_);
  auto& b = *buf_;
  forward_blocks(access, tokens, d, false);
  const int C = shape_.hidden;
  const float* x = b.xs + static_cast<std::size_t>(shape_.layers) * d.tokens() * static_cast<std::size_t>(C);
  // Only each sequence's last position, gathered into dnormed, which a forward-only head
  // does not write.
  float* rows = b.dnormed;
  for (int s = 0; s < B; ++s)
    k_->gpt().copy(rows + static_cast<std::size_t>(s) * C, x + (static_cast<std::size_t>(s) * T + (T - 1)) * C,
                   static_cast<std::size_t>(C));
  head(access, rows, B, nullptr, 0.0f, false, out);
}

}  // namespace strata::model
