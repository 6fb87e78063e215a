// ShardUpdate's whole-tensor optimizers (the protocol in shard_update.h) at ZeRO stage 0,
// where every rank holds every tensor whole: LAMB (only there: impl.cc) and Muon (above it:
// muon_update.cc), and what both Muon paths share. Each tensor steps on the device's stream,
// where its state and compute copies may be device memory (the host backend's: these
// optimizers have no CUDA kernel).
#include <cstring>
#include <vector>

#include "engine/detail/muon_runs.h"
#include "engine/shard_update.h"
#include "optim/adam.h"
#include "optim/lamb.h"
#include "optim/muon.h"

namespace strata::engine {

// LAMB: its trust ratio needs the whole tensor's norms.
void ShardUpdate::lamb(const optim::StepArgs& base, float lr) {
  const auto& oc = c_.cfg.optimizer;
  const bool fp32 = c_.cdt == DType::fp32;
  const std::size_t cbytes = dtype_size(c_.cdt);
  for (std::size_t li = 0; li < c_.layout.layers().size(); ++li) {
    const int l = static_cast<int>(li);
    if (c_.layout.layers()[li].frozen) continue;
    for (int pi : c_.layout.layers()[li].params) {
      const auto& p = c_.layout.params()[pi];
      const optim::LambConfig lamb{lr * p.lr_scale, oc.beta1,           oc.beta2,     oc.eps,
                                   oc.weight_decay, oc.bias_correction, oc.max_coeff, oc.min_coeff};
      optim::StepArgs a = base;
      a.n = p.numel;
      const auto& st = c_.state.resident(l);
      a.master = st.master + p.offset;
      a.m = static_cast<float*>(st.m) + p.offset;  // Lamb keeps fp32 moments (the config refuses bf16)
      a.v = static_cast<float*>(st.v) + p.offset;
      a.grad = c_.grads.acc_at(l, p.offset);
      a.grad_dtype = c_.grads.acc_dtype(l);  // lamb_step takes fp32 (device accumulators, stage 0)
      char* copy = static_cast<char*>(c_.updates.resident_copy(l)) + p.offset * cbytes;
      a.copy = fp32 ? nullptr : copy;
      c_.dev_stream.launch_host([lamb, a, copy, fp32] {
        std::vector<float> update(a.n);
        optim::lamb_step(lamb, a, update.data());
        if (fp32) std::memcpy(copy, a.master, a.n * 4);  // an fp32 compute copy is the master's bits
      });
    }
  }
  c_.dev_stream.synchronize();
}

optim::MuonConfig ShardUpdate::muon_config(int pi, float lr) const {
  const auto& oc = c_.cfg.optimizer;
  const auto& p = c_.layout.params()[static_cast<std::size_t>(pi)];
  optim::MuonConfig mc;
  mc.lr = lr * p.lr_scale;
  mc.momentum = oc.momentum;
  mc.nesterov = oc.nesterov;
  mc.weight_decay = oc.weight_decay / p.lr_scale;  // decoupled: decays at the base rate
  mc.adjust = oc.muon_match_rms_adamw ? optim::MuonLrAdjust::match_rms_adamw : optim::MuonLrAdjust::original;
  mc.ns.steps = oc.ns_steps;
  return mc;
}

float ShardUpdate::muon_adam_lr(float lr) const {
  const auto& oc = c_.cfg.optimizer;
  const float base = oc.adam_lr < 0 ? oc.lr : oc.adam_lr;
  return oc.lr > 0 ? lr * (base / oc.lr) : base;
}

// Muon on the hidden matrices (detail::muon_matrix), each orthogonalized whole; AdamW on the rest. A
// schedule's lr scales the AdamW side's rate by the same factor as Muon's.
void ShardUpdate::muon(const optim::StepArgs& base, float lr) {
  const auto& oc = c_.cfg.optimizer;
  const bool fp32 = c_.cdt == DType::fp32;
  const std::size_t cbytes = dtype_size(c_.cdt);
  const float adam_lr = muon_adam_lr(lr);
  for (std::size_t li = 0; li < c_.layout.layers().size(); ++li) {
    const int l = static_cast<int>(li);
    if (c_.layout.layers()[li].frozen) continue;
    for (int pi : c_.layout.layers()[li].params) {
      const auto& p = c_.layout.params()[static_cast<std::size_t>(pi)];
      optim::StepArgs a = base;
      a.n = p.numel;
      const auto& st = c_.state.resident(l);
      a.master = st.master + p.offset;
      a.m = static_cast<float*>(st.m) + p.offset;  // Muon keeps fp32 state (the config refuses other formats)
      a.grad = c_.grads.acc_at(l, p.offset);
      a.grad_dtype = c_.grads.acc_dtype(l);
      char* copy = static_cast<char*>(c_.updates.resident_copy(l)) + p.offset * cbytes;
      a.copy = fp32 ? nullptr : copy;
      if (detail::muon_matrix(c_.layout, l, pi)) {
        const optim::MuonConfig mc = muon_config(pi, lr);
        const int rows = static_cast<int>(p.shape[0]), cols = static_cast<int>(p.shape[1]);
        c_.dev_stream.launch_host([mc, a, rows, cols, copy, fp32] {
          optim::MuonScratch scratch;
          optim::muon_step(mc, a, rows, cols, scratch);
          if (fp32) std::memcpy(copy, a.master, a.n * 4);
        });
      } else {
        a.v = c_.state.v_at(l, st.v, p.offset);  // the layer's v has no matrix elements
        const float slr = adam_lr * p.lr_scale;
        const optim::AdamConfig adam{slr,  oc.beta1,          oc.beta2, oc.eps, oc.weight_decay / p.lr_scale,
                                     true, oc.bias_correction};  // as piece() steps it at stages 1-3
        c_.dev_stream.launch_host([adam, a, copy, fp32] {
          optim::adam_step(adam, a);
          if (fp32) std::memcpy(copy, a.master, a.n * 4);
        });
      }
    }
  }
  c_.dev_stream.synchronize();
}

}  // namespace strata::engine
