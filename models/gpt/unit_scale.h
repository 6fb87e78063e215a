// Unit scaling (Graphcore's recipe) for the GPT: fixed scale factors, derived from the shapes
// alone, keep weights, activations and gradients near unit variance at initialisation, so the
// model trains in FP16 and FP8 with no loss scaler and no per-tensor scales.
//
// The model (GptConfig::unit_scaled). Every weight is stored at unit scale (matrices and
// embeddings N(0,1); LayerNorm as usual) and each op carries the scale it needs:
//   - a matrix product has three: forward 1/sqrt(fan_in), input gradient 1/sqrt(fan_out)
//     (or the forward's, where the edge needs it: below), weight gradient 1/sqrt(rows);
//   - the embedding is (wte[tok] + wpe[t]) / sqrt(2);
//   - the attention scores are kScoreTemperature q.k / sqrt(head size): with unit q and k,
//     GPT-2's 1/sqrt(head size) alone gives scores of unit variance, and the softmax starts
//     from sharp random patterns that the plain model (q and k near 0.3 from its 0.02 init) never
//     sees; a quarter of it starts attention near uniform, as the output scale below assumes. A
//     sweep on the main job (temperatures 1, 1/4, 1/sqrt(32), 1/8) picked 1/4;
//   - attention's output (and its gradient) is multiplied by sqrt(T / H_T), H_T = 1 + 1/2 + ...
//     + 1/T, T the training sequence length (fixed, so shorter prompts compute the same
//     function): row t of causal attention averages t + 1 values, whose mean variance over the
//     rows is H_T / T when attention is uniform (the initial state, up to the softmax's spread);
//   - GELU's output (and gradient) by 1 / sqrt(E[gelu(x)^2]), x ~ N(0,1), so its second moment is 1;
//   - residual add j of the 2L (attention then MLP, block by block) is
//     sqrt((j+1)/(j+2)) skip + sqrt(1/(j+2)) branch: each branch and the embedding contribute
//     equally, the stream stays at unit variance, and since LayerNorm ignores scale this is
//     the usual pre-norm sum x + f(x) up to one factor per position in the stream;
//   - the loss gradient is sqrt(V) (softmax - onehot) per token instead of (softmax - onehot)/N.
// Gradients are right up to one constant per tensor, which Adam does not see: along any path
// from the loss to the residual stream the input-gradient scales multiply to the forward
// scales (the MLP's 1/sqrt(4C) and 1/sqrt(C) swap places; the attention's QKV product, whose
// fan-out is 3C, keeps its forward scale), and the tied wte's two uses (embedding and head)
// carry the same constant (the head's weight gradient takes its input gradient's scale).
// A global-norm clip stays valid (it scales every tensor of a step alike, which Adam's per-
// tensor normalisation keeps apart from the constants), but its threshold is in the unit-scaled
// norm, which runs 500-1000x the plain model's on the main job (where 300 clips every step).
//
// Learning rates: a weight that computes as s * W steps at lr / s (ParamSpec::lr_scale), so
// its effective step is the plain model's. s is the product's forward scale times any fixed
// scale on its input: the block matrices step at lr sqrt(fan_in), the attention projection also
// over attention's output scale and the MLP's down projection over GELU's; the tied wte at lr sqrt(C)
// (its head use; in the embedding, over sqrt(2), it then moves faster than the plain model's,
// which a sweep on the main job preferred to lr), and wpe as wte (they are summed); LayerNorms
// and biases at lr.
#pragma once

#include <array>
#include <vector>

#include "models/gpt/ops.h"

namespace strata::model {

struct GptShape;

class UnitScales {
 public:
  UnitScales(const GptShape& shape, int seq_len);
  // Block product k (0 QKV, 1 attention projection, 2 MLP up, 3 MLP down) over `rows` rows.
  ops::ProductScales product(int k, int rows) const noexcept;
  // The tied head: logits = (x wte^T) / sqrt(C).
  ops::ProductScales head() const noexcept;
  static float embedding() noexcept;
  float attention() const noexcept { return attention_; }
  // The attention scores' factor on q.k: kScoreTemperature / sqrt(head size).
  float scores() const noexcept { return scores_; }
  static constexpr float kScoreTemperature = 0.25f;
  static float gelu() noexcept;
  float loss_grad() const noexcept { return loss_grad_; }
  // Residual add j (0-based, 2 per block): out = skip(j) x + branch(j) f(x).
  static float skip(int j) noexcept;
  static float branch(int j) noexcept;
  // Each block product's forward scale, 1/sqrt(fan_in) (their weights step at lr over it).
  const std::array<float, 4>& forward() const noexcept { return fwd_; }

 private:
  std::array<float, 4> fwd_{}, grad_in_{};
  float head_fwd_ = 1, head_grad_ = 1, loss_grad_ = 1, attention_ = 1, scores_ = 1;
};

}  // namespace strata::model
