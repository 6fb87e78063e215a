// One line saying what a config trains with (config.h, describe_training): the optimizer,
// its hyperparameters and the schedule, and whether they are Strata's defaults because the
// config has no optimizer block. Trainers print it once at start, so that a default never
// changes results unseen (a config without an optimizer trains at lr 1e-3, one whose lr is
// "auto" at the Hugging Face trainer's 5e-5).
#include <cstdio>

#include "engine/config.h"

namespace strata::engine {

const char* optimizer_type_name(OptimizerType t) {
  switch (t) {
    case OptimizerType::adam:
      return "Adam";
    case OptimizerType::adamw:
      return "AdamW";
    case OptimizerType::lion:
      return "Lion";
    case OptimizerType::adagrad:
      return "Adagrad";
    case OptimizerType::lamb:
      return "Lamb";
    case OptimizerType::muon:
      return "Muon";
  }
  return "?";
}

std::string describe_training(const EngineConfig& c) {
  const OptimizerConfig& o = c.optimizer;
  char text[256];
  std::snprintf(text, sizeof text, "%s lr %g, betas %g/%g, eps %g, weight decay %g", optimizer_type_name(o.type), o.lr,
                o.beta1, o.beta2, o.eps, o.weight_decay);
  std::string out = text;
  if (o.type == OptimizerType::muon) {
    std::snprintf(text, sizeof text,
                  "Muon lr %g on the hidden matrices (momentum %g%s, %d Newton-Schulz steps, lr adjusted %s), AdamW "
                  "lr %g on the rest (betas %g/%g, eps %g), weight decay %g",
                  o.lr, o.momentum, o.nesterov ? ", Nesterov" : "", o.ns_steps,
                  o.muon_match_rms_adamw ? "to AdamW's RMS" : "by shape", o.adam_lr < 0 ? o.lr : o.adam_lr, o.beta1,
                  o.beta2, o.eps, o.weight_decay);
    out = text;
  }
  const SchedulerConfig& s = c.scheduler;
  switch (s.type) {
    case SchedulerType::none:
      out += "; constant lr";
      break;
    case SchedulerType::warmup_lr:
      std::snprintf(text, sizeof text, "; WarmupLR %g -> %g over %lld steps (%s)", s.warmup_min_lr, s.warmup_max_lr,
                    static_cast<long long>(s.warmup_num_steps), s.warmup_type.c_str());
      out += text;
      break;
    case SchedulerType::warmup_decay_lr:
      std::snprintf(text, sizeof text, "; WarmupDecayLR %g -> %g over %lld steps (%s), to 0 at step %lld",
                    s.warmup_min_lr, s.warmup_max_lr, static_cast<long long>(s.warmup_num_steps), s.warmup_type.c_str(),
                    static_cast<long long>(s.total_num_steps));
      out += text;
      break;
    case SchedulerType::warmup_cosine_lr:
      std::snprintf(text, sizeof text, "; WarmupCosineLR over %lld warmup steps, cosine to step %lld",
                    static_cast<long long>(s.warmup_num_steps), static_cast<long long>(s.total_num_steps));
      out += text;
      break;
  }
  if (c.gradient_clipping > 0) {
    std::snprintf(text, sizeof text, "; clipping at %g", c.gradient_clipping);
    out += text;
  }
  if (o.moment_format == MomentFormat::bf16)
    out += "; bf16 moments beside the fp32 master (bf16.bf16_optimizer_states)";
  if (o.moment_format == MomentFormat::q8)
    out += "; q8 moments (8 bits, a scale per 16 elements) beside the fp32 master (optimizer.moments)";
  if (!c.optimizer_given) out += " (Strata's defaults: the config has no optimizer block)";
  return out;
}

}  // namespace strata::engine
