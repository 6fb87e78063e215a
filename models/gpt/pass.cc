// The GPT's forward and backward over one micro-batch (see pass.h).
#include "models/gpt/pass.h"

#include <algorithm>

#include "models/gpt/fp8_cuda_products.h"
#include "models/gpt/kernels.h"
#include "models/gpt/ops.h"
#include "runtime/core/error.h"
#include "runtime/device/device.h"

namespace strata::model {
namespace {

struct Sizes {
  std::size_t xs, acts_each, sets, scratch, nc, n, logits;
  Fp8Products::ScratchFloats fp8;
  std::size_t total() const { return xs + acts_each * sets + scratch + 2 * nc + 2 * n + logits + n + fp8.total(); }
};

std::size_t att_floats(const BlockDims& d) {
  return static_cast<std::size_t>(d.B) * static_cast<std::size_t>(d.NH) * static_cast<std::size_t>(d.T) *
         static_cast<std::size_t>(d.T);
}

std::size_t head_rows(const GptShape& s, const BlockDims& max, bool fp8, bool cuda) {
  return head_chunk_rows(max.tokens(), max.B, s.vocab, fp8 || cuda);
}

Sizes sizes(const GptShape& s, const BlockDims& d, Remat r, bool fp8, bool cuda) {
  Sizes z{};
  z.nc = d.tokens() * static_cast<std::size_t>(s.d_model);
  z.n = d.tokens();
  z.xs = static_cast<std::size_t>(s.layers + 1) * z.nc;
  z.acts_each = BlockActs::floats(d);
  z.sets = static_cast<std::size_t>(remat_act_sets(r, s.layers));
  z.scratch = BlockScratch::floats(d);
  z.logits = head_rows(s, d, fp8, cuda) * static_cast<std::size_t>(s.vocab);
  if (fp8) z.fp8 = Fp8Products::scratch_floats(s, z.n);
  return z;
}

}  // namespace

struct GptPass::Buffers {
  device::DeviceBuffer mem;
  float* xs = nullptr;  // the residual stream: block l's input at l * NC (of the largest batch)
  std::vector<BlockActs> acts;
  BlockScratch scratch{};
  float *dres = nullptr, *lnf = nullptr, *lnf_mean = nullptr, *lnf_rstd = nullptr, *logits = nullptr, *losses = nullptr;
  std::size_t nc = 0;
};

std::uint64_t GptPass::device_bytes(const GptShape& shape, int max_batch, int max_seq, Remat remat, bool fp8,
                                    bool cuda) {
  BlockDims d{max_batch, max_seq, shape.d_model, shape.heads};
  d.full_scores = cuda;
  const std::uint64_t scratch = cuda ? cuda_scratch_bytes(static_cast<int>(d.tokens()), att_floats(d)) : 0;
  const std::uint64_t fp8_state = fp8 && cuda ? CudaFp8Products::device_bytes(shape) : 0;
  return sizes(shape, d, remat, fp8, cuda).total() * sizeof(float) + scratch + fp8_state;
}

GptPass::GptPass(const GptShape& shape, int max_batch, int max_seq, Remat remat, device::Device& dev,
                 ops::Products products, const fp8::Recipe& fp8, bool unit_scaled)
    : shape_(shape),
      remat_(remat),
      products_(products),
      max_{max_batch, max_seq, shape.d_model, shape.heads},
      dev_(dev),
      buf_(std::make_unique<Buffers>()),
      unit_(unit_scaled ? std::make_unique<UnitScales>(shape, max_seq) : nullptr) {
  k_ = make_kernels(dev, static_cast<int>(max_.tokens()), att_floats(max_));
  max_.full_scores = k_->keeps_full_scores();
  const bool cuda = dev.backend() == device::Backend::cuda;
  const Sizes z = sizes(shape_, max_, remat_, fp8.enabled, cuda);
  head_rows_ = static_cast<int>(head_rows(shape_, max_, fp8.enabled, cuda));
  auto& b = *buf_;
  b.mem = device::DeviceBuffer(dev, z.total() * sizeof(float), "gpt activations");
  float* p = b.mem.as<float>();
  auto take = [&p](std::size_t n) {
    float* r = p;
    p += n;
    return r;
  };
  b.nc = z.nc;
  b.xs = take(z.xs);
  b.acts.resize(z.sets);
  for (auto& a : b.acts) a.carve(take(z.acts_each), max_);
  b.scratch.carve(take(z.scratch), max_);
  b.dres = take(z.nc);
  b.lnf = take(z.nc);
  b.lnf_mean = take(z.n);
  b.lnf_rstd = take(z.n);
  b.logits = take(z.logits);
  b.losses = take(z.n);
  if (fp8.enabled) {
    Fp8Products::Scratch q;
    q.x = take(z.fp8.x);
    q.w = take(z.fp8.w);
    q.g = take(z.fp8.g);
    if (dev.backend() == device::Backend::cuda) {
      fp8_ = std::make_unique<CudaFp8Products>(fp8, shape_, static_cast<int>(max_.tokens()), q, *k_, dev);
    } else {
      fp8_ = std::make_unique<Fp8Products>(fp8, shape_, q, *k_);
    }
  }
}

GptPass::~GptPass() = default;

GptKernels& GptPass::kernels() noexcept { return *k_; }

int GptPass::act_set(int block) const noexcept { return remat_act_set(remat_, block, shape_.layers); }

bool GptPass::recompute(int block) const noexcept { return remat_recomputes(remat_, block, shape_.layers); }

namespace {
BlockWeights block_weights(const std::vector<const float*>& v) {
  BlockWeights w{};
  std::copy_n(v.begin(), kBlockParams, w.begin());
  return w;
}
BlockGrads block_grads(const std::vector<float*>& v) {
  BlockGrads g{};
  std::copy_n(v.begin(), kBlockParams, g.begin());
  return g;
}
}  // namespace

// Embedding and blocks; with keep, each block's activations go to its set for backward,
// otherwise every block uses set 0.
void GptPass::forward_blocks(LayerAccess& access, const std::int32_t* tokens, const BlockDims& d, bool keep) {
  auto& b = *buf_;
  const int L = shape_.layers;
  const std::size_t NC = d.tokens() * static_cast<std::size_t>(d.C);
  {
    const auto w = access.acquire(0);
    k_->embedding_forward(b.xs, tokens, w[0], w[1], d.B, d.T, d.C);
    if (unit_) k_->scale(b.xs, UnitScales::embedding(), d.tokens() * static_cast<std::size_t>(d.C));
    access.release(0);
  }
  for (int l = 0; l < L; ++l) {
    const auto w = access.acquire(l + 1);
    BlockDims bd = d;
    bd.block = l;
    block_forward(b.xs + static_cast<std::size_t>(l + 1) * NC, b.xs + static_cast<std::size_t>(l) * NC,
                  block_weights(w), b.acts[static_cast<std::size_t>(keep ? act_set(l) : 0)], bd);
    access.release(l + 1);
  }
}

// ln_f, the tied LM head and the loss; with backward, the head's gradients too (ln_f's
// committed, wte's left open in layer 0's accumulators) and dres = dL/d(last block output).
double GptPass::head(LayerAccess& access, const std::int32_t* targets, const BlockDims& d, float grad_scale,
                     bool backward) {
  auto& b = *buf_;
  const int L = shape_.layers, N = static_cast<int>(d.tokens()), C = d.C, V = shape_.vocab;
  const float* x = b.xs + static_cast<std::size_t>(L) * d.tokens() * static_cast<std::size_t>(C);
  const auto wf = access.acquire(L + 1);
  const auto we = access.acquire(0);
  k_->layernorm_forward(b.lnf, b.lnf_mean, b.lnf_rstd, x, wf[0], wf[1], N, C);
  const ops::ProductScales hs = unit_ ? unit_->head() : ops::ProductScales{};
  float* dlnf = b.scratch.dln;
  float* dwte = backward ? access.grads(0)[0] : nullptr;
  // The logits, the loss and the head's gradients chunk by chunk of head_rows_ rows (all of
  // them in one chunk on CUDA, with FP8, or when they fit): dwte sums the chunks in order.
  double loss = 0.0;
  for (int r0 = 0; r0 < N; r0 += head_rows_) {
    const int rows = std::min(head_rows_, N - r0);
    const float* in = b.lnf + static_cast<std::size_t>(r0) * C;
    if (fp8_) {
      fp8_->head_forward(b.logits, in, we[0], rows, C, V, hs);
    } else {
      k_->lm_head_forward(b.logits, in, we[0], rows, C, V, d.products, hs);
    }
    loss += k_->cross_entropy(b.logits, b.losses + r0, targets + r0, rows, V, grad_scale);
    if (!backward) continue;
    float* dinp = dlnf + static_cast<std::size_t>(r0) * C;
    if (fp8_) {
      fp8_->head_backward(dinp, dwte, b.logits, in, we[0], rows, C, V, hs);
    } else {
      k_->lm_head_backward(dinp, dwte, b.logits, in, we[0], rows, C, V, d.products, hs);
    }
  }
  if (backward) {
    access.release(0);
    const auto gf = access.grads(L + 1);
    k_->zero(b.dres, d.tokens() * static_cast<std::size_t>(C));
    k_->layernorm_backward(b.dres, gf[0], gf[1], dlnf, x, wf[0], b.lnf_mean, b.lnf_rstd, N, C);
    access.commit(L + 1);
  } else {
    access.release(0);
  }
  access.release(L + 1);
  return loss;
}

BlockDims GptPass::dims(int B, int T) const {
  STRATA_CHECK(B >= 1 && B <= max_.B && T >= 1 && T <= max_.T, Errc::invalid_argument, "gpt: batch ", B, " x ", T,
               " is larger than the pass was sized for (", max_.B, " x ", max_.T, ")");
  BlockDims d{B, T, shape_.d_model, shape_.heads, products_, fp8_.get()};
  d.unit = unit_.get();
  d.kernels = k_.get();
  d.full_scores = k_->keeps_full_scores();
  return d;
}

double GptPass::train(LayerAccess& access, const std::int32_t* tokens, const std::int32_t* targets, int B, int T,
                      float loss_scale) {
  const BlockDims d = dims(B, T);
  device::CpuAccessScope cpu(dev_);
  auto& b = *buf_;
  const std::size_t NC = d.tokens() * static_cast<std::size_t>(d.C);
  const int L = shape_.layers;
  if (fp8_) fp8_->set_recording(true);
  forward_blocks(access, tokens, d, true);
  // The mean loss's gradient, or unit scaling's (unit_scale.h).
  const float grad_scale = unit_ ? loss_scale * unit_->loss_grad() : loss_scale / static_cast<float>(d.tokens());
  const double loss = head(access, targets, d, grad_scale, true);
  for (int l = L - 1; l >= 0; --l) {
    const auto w = block_weights(access.acquire(l + 1));
    const BlockActs& a = b.acts[static_cast<std::size_t>(act_set(l))];
    float* x = b.xs + static_cast<std::size_t>(l) * NC;
    BlockDims bd = d;
    bd.block = l;
    // Recomputing writes the block's output again (the same bits); it is no longer read.
    if (recompute(l)) block_forward(x + NC, x, w, a, bd);
    block_backward(b.dres, x, w, block_grads(access.grads(l + 1)), a, b.scratch, bd);
    access.commit(l + 1);
    access.release(l + 1);
  }
  const auto w0 = access.acquire(0);
  const auto g0 = access.grads(0);
  if (unit_) k_->scale(b.dres, UnitScales::embedding(), NC);
  k_->embedding_backward(g0[0], g0[1], b.dres, tokens, B, T, d.C);
  access.commit(0);
  access.release(0);
  if (fp8_) fp8_->set_recording(false);
  return loss;
}

double GptPass::loss(LayerAccess& access, const std::int32_t* tokens, const std::int32_t* targets, int B, int T) {
  const BlockDims d = dims(B, T);
  if (fp8_) fp8_->set_recording(false);
  device::CpuAccessScope cpu(dev_);
  forward_blocks(access, tokens, d, false);
  return head(access, targets, d, 0.0f, false);
}

void GptPass::last_logits(LayerAccess& access, const std::int32_t* tokens, int B, int T, float* out) {
  const BlockDims d = dims(B, T);
  if (fp8_) fp8_->set_recording(false);
  device::CpuAccessScope cpu(dev_);
  auto& b = *buf_;
  const int L = shape_.layers, C = d.C;
  forward_blocks(access, tokens, d, false);
  const auto wf = access.acquire(L + 1);
  const auto we = access.acquire(0);
  // Only each sequence's last position: gather those rows, then norm and project them.
  float* rows = b.scratch.dln;
  const float* x = b.xs + static_cast<std::size_t>(L) * d.tokens() * static_cast<std::size_t>(C);
  for (int s = 0; s < B; ++s) {
    const float* r = x + (static_cast<std::size_t>(s) * T + static_cast<std::size_t>(T - 1)) * C;
    k_->copy(rows + static_cast<std::size_t>(s) * C, r, static_cast<std::size_t>(C));
  }
  k_->layernorm_forward(b.lnf, b.lnf_mean, b.lnf_rstd, rows, wf[0], wf[1], B, C);
  const ops::ProductScales hs = unit_ ? unit_->head() : ops::ProductScales{};
  if (fp8_) {
    fp8_->head_forward(b.logits, b.lnf, we[0], B, C, shape_.vocab, hs);
  } else {
    k_->lm_head_forward(b.logits, b.lnf, we[0], B, C, shape_.vocab, d.products, hs);
  }
  k_->to_host(out, b.logits, static_cast<std::size_t>(B) * shape_.vocab);
  access.release(0);
  access.release(L + 1);
}

}  // namespace strata::model
