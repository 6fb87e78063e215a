// fp16/bf16 (and Strata's fp8), optimizer, scheduler and memory_budget sections, with DeepSpeed's names and
// defaults (runtime/precision_config.py, ops/adam, ops/lion, runtime/lr_schedules.py).
#include <cmath>
#include <limits>

#include "engine/detail/sections.h"
#include "runtime/core/error.h"
#include "runtime/core/log.h"

namespace strata::engine::detail {
namespace {

constexpr double kMax = std::numeric_limits<double>::max();

void refuse_auto_enabled(ObjectReader& r) {
  if (r.is_auto("enabled")) {
    r.refuse_auto("enabled", "true or false",
                  "Strata cannot see which precision the trainer was asked for (--bf16 or --fp16)");
  }
}

void read_fp16(ObjectReader& top, Fp16Config& fp16) {
  ObjectReader r = top.child("fp16");
  refuse_auto_enabled(r);
  r.read_bool("enabled", fp16.enabled);
  r.read_float("loss_scale", 0, kMax, "use 0 (dynamic loss scaling) or a fixed scale > 0", fp16.loss_scale);
  r.read_int("initial_scale_power", 0, 127, "use a whole number from 0 to 127 (the first scale is 2^power)",
             fp16.initial_scale_power);
  r.read_int("loss_scale_window", 1, std::numeric_limits<int>::max(), "use a whole number of steps >= 1",
             fp16.loss_scale_window);
  r.read_int("hysteresis", 1, std::numeric_limits<int>::max(), "use a whole number of overflows >= 1", fp16.hysteresis);
  r.read_float("min_loss_scale", std::numeric_limits<float>::min(), kMax, "use a number > 0", fp16.min_loss_scale);
  r.notice("fused_mode");  // an implementation choice in DeepSpeed; same arithmetic
  r.notice("auto_cast");   // DeepSpeed casts the model's inputs; Strata's trainers cast their own (strata.torch does)
  r.notice_if("consecutive_hysteresis", false,
              "changes when the loss scale drops and Strata's loss scaler does not support it: remove the key or "
              "set it to false");
  r.notice_if("fp16_master_weights_and_grads", false,
              "Strata keeps fp32 master weights and gradients: remove the key or set it to false");
}

void read_bf16(ObjectReader& top, EngineConfig& config) {
  bool& enabled = config.bf16;
  // "bfloat16" is DeepSpeed's old name, still read when "bf16" is absent.
  if (top.has("bf16") && top.has("bfloat16")) {
    top.context().fail("bf16 and bfloat16 (its old name) are both given: keep bf16");
  }
  ObjectReader r = top.child(top.has("bfloat16") ? "bfloat16" : "bf16");
  top.child(top.has("bfloat16") ? "bf16" : "bfloat16");  // declare the other name too
  refuse_auto_enabled(r);
  r.read_bool("enabled", enabled);
  r.notice("immediate_grad_update");  // when accumulated gradients are applied, not how
  const char* unsupported = "Strata does not support it: remove the key or set it to false";
  r.notice_if("check_grad_overflow", false, unsupported);
  r.notice_if("bf16_master_weights_and_grads", false,
              "Strata keeps fp32 master weights: set it to false (bf16_optimizer_states on its own keeps the "
              "moments in bf16)");
  // exp_avg and exp_avg_sq in bf16, as in DeepSpeed; DeepSpeed takes it only beside
  // bf16_master_weights_and_grads (bf16 masters), and Strata keeps fp32 masters.
  bool bf16_states = false;
  if (r.read_bool("bf16_optimizer_states", bf16_states) && bf16_states) {
    if (!enabled) {
      r.fail_value("bf16_optimizer_states", true,
                   "needs bf16.enabled true (DeepSpeed reads the bf16 block only when it is enabled): enable bf16 or "
                   "remove the key");
    }
    config.optimizer.moment_format = MomentFormat::bf16;
  }
}

// betas: two numbers in [0, 1).
void read_betas(ObjectReader& p, OptimizerConfig& opt) {
  const Json* v = p.find("betas");
  if (v == nullptr) return;
  if (p.is_auto("betas")) p.refuse_auto("betas", "two numbers like [0.9, 0.999]");
  const char* range = "use two numbers from 0 up to (not including) 1, like [0.9, 0.999]";
  if (!v->is_array() || v->size() != 2 || !(*v)[0].is_number() || !(*v)[1].is_number()) {
    p.fail_value("betas", *v, str_cat("has the wrong type: ", range));
  }
  const double b1 = (*v)[0].get<double>(), b2 = (*v)[1].get<double>();
  if (!(b1 >= 0 && b1 < 1 && b2 >= 0 && b2 < 1)) p.fail_value("betas", *v, str_cat("is out of range: ", range));
  opt.beta1 = static_cast<float>(b1);
  opt.beta2 = static_cast<float>(b2);
}

// A key that belongs to another type of the same section ("eps" for Lion): DeepSpeed would
// fail constructing the optimizer or scheduler; say which type it belongs to.
void not_for(ObjectReader& p, const char* key, const std::string& type, const char* advice) {
  if (p.has(key)) p.fail_value(key, *p.find(key), str_cat("is not a parameter of ", type, ": ", advice));
}

// Muon's own keys (DeepSpeed's muon_lr and adam_lr, torch.optim.Muon's momentum, nesterov,
// ns_steps and adjust_lr_fn as lr_adjust); betas and eps are its AdamW side's.
void read_muon(ObjectReader& p, OptimizerConfig& opt) {
  float muon_lr = opt.lr;
  if (p.read_float("muon_lr", 0, kMax, "use a number >= 0", muon_lr)) {
    if (p.has("lr") && muon_lr != opt.lr)
      p.fail_value("muon_lr", *p.find("muon_lr"), "disagrees with lr (both are Muon's learning rate): keep one");
    opt.lr = muon_lr;
  }
  p.read_float("adam_lr", 0, kMax, "use a number >= 0 (the AdamW side's learning rate)", opt.adam_lr);
  p.read_float("momentum", 0, 0.999999, "use a number from 0 up to (not including) 1, like 0.95", opt.momentum);
  p.read_bool("nesterov", opt.nesterov);
  p.read_int("ns_steps", 1, 100, "use a whole number of Newton-Schulz iterations from 1 to 100 (5 is usual)",
             opt.ns_steps);
  std::string adjust;
  if (p.read_choice("lr_adjust", {"original", "match_rms_adamw"}, adjust))
    opt.muon_match_rms_adamw = adjust == "match_rms_adamw";
}

void read_fp8(ObjectReader& top, Fp8Config& fp8) {
  ObjectReader r = top.child("fp8");
  r.read_bool("enabled", fp8.enabled);
  r.read_choice("format", {"hybrid", "e4m3"}, fp8.format);
  r.read_int("amax_history_len", 1, 1 << 20, "use a whole number of steps from 1 to 1048576", fp8.amax_history_len);
  r.read_choice("amax_compute", {"max", "most_recent"}, fp8.amax_compute);
  r.read_int("margin", 0, 30, "use a whole number of powers of two from 0 to 30", fp8.margin);
  r.read_bool("block_scaling", fp8.block_scaling);
  r.read_choice("scaling", {"delayed", "none"}, fp8.scaling);
  if (fp8.block_scaling && fp8.scaling == "none")
    r.context().fail(
        "fp8.block_scaling and fp8.scaling \"none\" contradict each other: block scaling scales "
        "each block by its amax, \"none\" casts at scale 1; choose one");
}

}  // namespace

void read_precision(ObjectReader& top, EngineConfig& config) {
  read_fp16(top, config.fp16);
  read_bf16(top, config);
  read_fp8(top, config.fp8);
  top.context().defer([&ctx = top.context(), &config] {
    if (config.bf16 && config.fp16.enabled)
      ctx.fail("fp16.enabled and bf16.enabled are both true: choose one precision");
    const OptimizerType t = config.optimizer.type;
    if (config.optimizer.moment_format == MomentFormat::bf16 && t == OptimizerType::lamb)
      ctx.fail(
          "bf16 moments (bf16.bf16_optimizer_states or optimizer.moments) with optimizer Lamb: Strata's Lamb keeps "
          "fp32 moments; use AdamW, Lion or Adagrad, or remove the key");
    if (config.optimizer.moment_format != MomentFormat::fp32 && t == OptimizerType::muon)
      ctx.fail(str_cat(moment_format_name(config.optimizer.moment_format),
                       " moments (bf16.bf16_optimizer_states or optimizer.moments) with optimizer Muon: Strata's Muon "
                       "keeps an fp32 momentum; remove the key, or use AdamW"));
    // What the engine refuses, said before a run is sized.
    if (t == OptimizerType::lamb && config.zero.stage != 0)
      ctx.fail(str_cat("optimizer.type = \"Lamb\" needs zero_optimization.stage 0 (stage is ", config.zero.stage,
                       "): it scales each tensor's update by whole-tensor norms, and ZeRO stages 1-3 split tensors "
                       "across ranks"));
    if (config.optimizer.moment_format == MomentFormat::q8 && t != OptimizerType::adam && t != OptimizerType::adamw)
      ctx.fail(str_cat("optimizer.moments \"q8\" with optimizer ", optimizer_type_name(t),
                       ": q8 moments are for Adam and AdamW; use \"bf16\" (or fp32) with this optimizer"));
  });
}

void read_optimizer(ObjectReader& top, EngineConfig& config) {
  ObjectReader r = top.child("optimizer");
  OptimizerConfig& opt = config.optimizer;
  r.notice("legacy_fusion");
  std::string type;
  // DeepSpeed's optimizers that Strata does not implement are named as such (DeepSpeed runs them).
  if (const Json* t = r.find("type"); t != nullptr && t->is_string()) {
    const std::string name = t->get<std::string>();
    for (const char* other : {"OneBitAdam", "OneBitLamb", "ZeroOneAdam", "MuAdam", "MuAdamW", "MuSGD"}) {
      if (name == other) {
        r.fail_value("type", *t,
                     "is a DeepSpeed optimizer Strata does not implement (its optimizers are Adam, AdamW, Lion, "
                     "Adagrad, Lamb and Muon): use one of those");
      }
    }
  }
  const bool typed = r.read_choice("type", {"Adam", "AdamW", "Lion", "Adagrad", "Lamb", "Muon"}, type);
  // Strata's key beside DeepSpeed's bf16.bf16_optimizer_states: how exp_avg and exp_avg_sq are kept.
  std::string moments;
  if (r.read_choice("moments", {"fp32", "bf16", "q8"}, moments)) {
    const MomentFormat f = parse_moment_format(moments);
    if (opt.moment_format == MomentFormat::bf16 && f != MomentFormat::bf16)
      r.fail_value("moments", Json(moments),
                   "disagrees with bf16.bf16_optimizer_states = true (bf16 moments): keep one of the two keys");
    opt.moment_format = f;
  }
  ObjectReader p = r.child("params");
  if (!r.present()) return;
  config.optimizer_given = true;
  if (!typed) {
    // Declare every parameter name, so that only a misspelled "type" is reported before this.
    for (const char* key : {"lr", "betas", "eps", "weight_decay", "bias_correction", "adam_w_mode", "amsgrad",
                            "torch_adam", "max_grad_norm", "max_coeff", "min_coeff", "momentum", "nesterov", "ns_steps",
                            "lr_adjust", "muon_lr", "adam_lr"}) {
      p.find(key);
    }
    r.context().defer(
        [&ctx = r.context()] { ctx.fail("optimizer.type is missing: use Adam, AdamW, Lion, Adagrad, Lamb or Muon"); });
    return;
  }
  const bool adam = type == "Adam" || type == "AdamW";
  opt.type = type == "Lion"      ? OptimizerType::lion
             : type == "Adagrad" ? OptimizerType::adagrad
             : type == "Lamb"    ? OptimizerType::lamb
             : type == "Muon"    ? OptimizerType::muon
                                 : OptimizerType::adamw;
  if (type == "Lamb") {  // DeepSpeed's FusedLamb: bias_correction, max_coeff and min_coeff too
    p.read_bool("bias_correction", opt.bias_correction);
    p.read_float("max_coeff", 0, kMax, "use a number > 0 (the trust ratio's upper clamp)", opt.max_coeff);
    p.read_float("min_coeff", 0, kMax, "use a number > 0 (the trust ratio's lower clamp)", opt.min_coeff);
  }
  if (type == "Adagrad") {  // DeepSpeed's (and PyTorch's) Adagrad defaults
    opt.lr = 1e-2f;
    opt.eps = 1e-10f;
  }
  p.read_float("lr", 0, kMax, "use a number >= 0", opt.lr);
  if (type == "Muon") read_muon(p, opt);
  if (type != "Adagrad") read_betas(p, opt);
  if (type != "Lion") p.read_float("eps", 0, kMax, "use a number >= 0", opt.eps);
  p.read_float("weight_decay", 0, kMax, "use a number >= 0", opt.weight_decay);
  if (adam) {
    p.read_bool("bias_correction", opt.bias_correction);
    // DeepSpeed: type Adam with adam_w_mode true (its default) is AdamW; false is Adam with
    // L2 regularisation. Type AdamW is always AdamW, so false there is a contradiction.
    bool adam_w_mode = true;
    if (p.read_bool("adam_w_mode", adam_w_mode) && !adam_w_mode) {
      if (type == "AdamW") {
        p.fail_value("adam_w_mode", false,
                     "contradicts optimizer.type \"AdamW\": use type \"Adam\" for Adam with L2 regularisation");
      }
      opt.type = OptimizerType::adam;
    }
    p.notice("torch_adam");  // picks PyTorch's kernel in DeepSpeed; the arithmetic is the same
  }
  if (type != "Lion") {
    p.notice_if("amsgrad", false, "AMSGrad is not supported: remove the key or set it to false");
  }
  p.refuse("max_grad_norm", "use the top-level key gradient_clipping");
  if (!adam && type != "Lamb") {
    const char* only_adam = "it applies to Adam and AdamW only: remove it";
    not_for(p, "bias_correction", type, only_adam);
    not_for(p, "adam_w_mode", type, only_adam);
    not_for(p, "torch_adam", type, only_adam);
  }
  if (type == "Lamb") {
    not_for(p, "adam_w_mode", type, "it applies to Adam and AdamW only: remove it");
    not_for(p, "torch_adam", type, "it applies to Adam and AdamW only: remove it");
  }
  if (type != "Muon") {
    for (const char* key : {"momentum", "nesterov", "ns_steps", "lr_adjust", "muon_lr", "adam_lr"})
      not_for(p, key, type, "it applies to Muon only: remove it");
  }
  if (type == "Muon") {
    const char* adamw = "Muon's other parameters take plain AdamW (bias-corrected, decoupled decay): remove it";
    not_for(p, "adam_w_mode", type, adamw);
    not_for(p, "bias_correction", type, adamw);
    not_for(p, "torch_adam", type, adamw);
  }
  if (type == "Lion") not_for(p, "eps", type, "Lion uses the sign of its update and has no epsilon: remove it");
  if (type == "Adagrad") not_for(p, "betas", type, "Adagrad keeps no moving averages: remove it");
}

void read_scheduler(ObjectReader& top, EngineConfig& config) {
  ObjectReader r = top.child("scheduler");
  SchedulerConfig& s = config.scheduler;
  std::string type;
  const bool typed = r.read_choice("type", {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR"}, type);
  ObjectReader p = r.child("params");
  if (!r.present()) return;
  if (!typed) {
    for (const char* key : {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "total_num_steps",
                            "warmup_min_ratio", "cos_min_ratio", "last_batch_iteration"}) {
      p.find(key);
    }
    r.context().defer(
        [&ctx = r.context()] { ctx.fail("scheduler.type is missing: use WarmupLR, WarmupDecayLR or WarmupCosineLR"); });
    return;
  }
  const bool cosine = type == "WarmupCosineLR";
  s.type = type == "WarmupLR" ? SchedulerType::warmup_lr
           : cosine           ? SchedulerType::warmup_cosine_lr
                              : SchedulerType::warmup_decay_lr;
  const auto max64 = std::numeric_limits<std::int64_t>::max();
  p.read_int("warmup_num_steps", 0, max64, "use a whole number of steps >= 0", s.warmup_num_steps);
  p.read_choice("warmup_type", {"log", "linear"}, s.warmup_type);
  p.notice_if("last_batch_iteration", -1,
              "would start the schedule part-way; Strata resumes schedules from its checkpoints: remove the key "
              "or set it to -1");
  if (cosine) {
    const char* ratios = "WarmupCosineLR scales the optimizer's lr: use warmup_min_ratio and cos_min_ratio";
    not_for(p, "warmup_min_lr", type, ratios);
    not_for(p, "warmup_max_lr", type, ratios);
    p.read_float("warmup_min_ratio", 0, 1, "use a fraction from 0 to 1 of the optimizer's lr", s.warmup_min_ratio);
    p.read_float("cos_min_ratio", 0, 1, "use a fraction from 0 to 1 of the optimizer's lr", s.cos_min_ratio);
    s.warmup_max_lr = config.optimizer.lr;  // the cosine schedule peaks at the optimizer's lr
  } else {
    not_for(p, "warmup_min_ratio", type, "it belongs to WarmupCosineLR: use warmup_min_lr");
    not_for(p, "cos_min_ratio", type, "it belongs to WarmupCosineLR");
    p.read_float("warmup_min_lr", 0, kMax, "use a number >= 0", s.warmup_min_lr);
    // WarmupLR's peak defaults to the optimizer's lr (current DeepSpeed: warmup_max_lr=None;
    // older releases used 0.001 and overrode the optimizer); WarmupDecayLR keeps 0.001.
    s.warmup_max_lr = type == "WarmupLR" ? config.optimizer.lr : 1e-3f;
    p.read_float("warmup_max_lr", 0, kMax, "use a number >= 0", s.warmup_max_lr);
  }
  if (type == "WarmupLR") {
    not_for(p, "total_num_steps", type, "WarmupLR holds its peak forever; use WarmupDecayLR or WarmupCosineLR to end");
  } else {
    const bool given = p.read_int("total_num_steps", 1, max64, "use a whole number of steps >= 1", s.total_num_steps);
    top.context().defer([p, &s, type, given, cosine, source = top.context().source()] {
      if (!given) {
        p.context().fail(str_cat(p.path_of("total_num_steps"), " is required by ", type,
                                 ": give the number of optimizer steps of the run"));
      }
      // DeepSpeed warms up over at least 2 steps (log(1) would divide by zero).
      const std::int64_t warmup = std::max<std::int64_t>(2, s.warmup_num_steps);
      if (cosine && s.total_num_steps <= warmup) {
        p.fail_value("total_num_steps", s.total_num_steps,
                     str_cat("is out of range: WarmupCosineLR needs more steps than its warmup (", warmup,
                             " steps), or the cosine phase has no length"));
      }
      if (!cosine && s.total_num_steps < warmup) {
        STRATA_LOG(warn, source, ": ", p.path_of("total_num_steps"), " = ", s.total_num_steps,
                   " is less than the warmup (", warmup, " steps): the lr drops to warmup_min_lr when the warmup ends");
      }
    });
  }
}

void read_memory_budget(ObjectReader& top, EngineConfig& config) {
  ObjectReader r = top.child("memory_budget");
  r.read_bytes("device", config.memory_budget.device);
  r.read_bytes("host", config.memory_budget.host);
  r.read_bytes("nvme", config.memory_budget.nvme);
}

void read_checkpoint(ObjectReader& top, EngineConfig& config) {
  ObjectReader r = top.child("checkpoint");
  r.read_string("save_dir", config.checkpoint.save_dir);
  r.read_int("save_every", 0, std::numeric_limits<std::int64_t>::max(), "a step count >= 0 (0: after the last step)",
             config.checkpoint.save_every);
  r.read_int("keep", 0, 1 << 20, "a count >= 0 (0 keeps every checkpoint)", config.checkpoint.keep);
  r.read_bool("async", config.checkpoint.async);
  for (const char* key : {"tag_validation", "load_universal", "use_node_local_storage", "parallel_write"})
    r.notice(key);
}

}  // namespace strata::engine::detail
