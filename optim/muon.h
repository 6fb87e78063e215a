// CPU Muon (Jordan et al. 2024, "Muon: an optimizer for hidden layers in neural networks";
// PyTorch ships it as torch.optim.Muon, whose definition this follows): momentum SGD on a 2-D
// weight whose update is orthogonalized (newton_schulz.h), one state buffer (the momentum).
// Meant for the hidden matrices of a network; embeddings, the head, norms and biases take
// AdamW beside it (the engine's Muon does, engine/config.h).
//
// Per step, for a rows x cols matrix (rows: output features, as torch.nn.Linear stores it),
// g = grad * grad_scale and mu = momentum:
//   m = m + (1 - mu) (g - m)                    (m.lerp_(g, 1 - mu))
//   u = nesterov ? m - (1 - mu) (m - g) : m     (g.lerp(m, mu): PyTorch's form for weights >= 0.5)
//   O = newton_schulz(u)
//   p = p (1 - lr wd) - adjusted_lr O
// adjusted_lr = lr sqrt(max(1, rows / cols)) ("original", the reference's) or
// lr 0.2 sqrt(max(rows, cols)) ("match_rms_adamw", Moonlight's: an update of AdamW's RMS, so
// AdamW's lr and weight decay carry over). Only the orthogonalization needs the whole
// matrix: muon_momentum and muon_apply are elementwise and run on any slice of it.
#pragma once

#include <cstddef>
#include <vector>

#include "optim/newton_schulz.h"
#include "optim/step_args.h"

namespace strata::optim {

enum class MuonLrAdjust { original, match_rms_adamw };

// torch.optim.Muon's defaults.
struct MuonConfig {
  float lr = 1e-3f;
  float momentum = 0.95f;
  bool nesterov = true;
  float weight_decay = 0.1f;
  MuonLrAdjust adjust = MuonLrAdjust::original;
  NewtonSchulz ns;
};

// Throws Errc::invalid_argument naming the field: lr >= 0, momentum in [0, 1),
// weight_decay >= 0, ns.steps in [0, 100], ns.eps > 0, all finite.
void validate(const MuonConfig& config);

float muon_adjusted_lr(const MuonConfig& config, int rows, int cols);

// Elementwise on args.n elements: updates the momentum (StepArgs::m, fp32) from the gradient
// (fp32, bf16 or fp16, times grad_scale) and writes the update u to `update` (fp32, n).
void muon_momentum(const MuonConfig& config, const StepArgs& args, float* update);

// Elementwise on args.n elements: p = p (1 - lr wd) - adjusted_lr o; writes args.copy if set.
void muon_apply(const MuonConfig& config, const StepArgs& args, const float* orthogonalized, float adjusted_lr);

// Buffers of muon_step, grown as needed and kept between calls.
struct MuonScratch {
  std::vector<float> update, ns;
};

// One whole matrix (args.n == rows * cols): momentum, orthogonalization, update. Bits
// independent of the thread count.
void muon_step(const MuonConfig& config, const StepArgs& args, int rows, int cols, MuonScratch& scratch);

}  // namespace strata::optim
