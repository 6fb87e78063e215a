// StepScalars (the protocol in step_scalars.h): the global norm in a fixed order, the plan,
// the learning rate and the counters.
#include "engine/step_scalars.h"

#include <algorithm>
#include <array>
#include <vector>

#include "runtime/core/error.h"

namespace strata::engine {

void StepScalars::restore(const Counters& c) {
  scaler_.restore(c.scaler);  // checks the scaler's state first: a bad one leaves the counters as they were
  taken_ = c.steps_taken;
  calls_ = c.step_calls;
}

optim::StepPlan StepScalars::plan() {
  ++calls_;
  optim::GradNorm global = global_grad_norm();
  const double avg = averaging();
  global.sumsq /= avg * avg;
  return optim::plan_step(global, scaler_, c_.cfg.gradient_clipping);
}

StepBet StepScalars::bet() const {
  optim::StepPlan plan;
  plan.grad_scale = static_cast<float>(1.0 / scaler_.scale());  // plan_step's grad_scale at clip coefficient 1
  StepBet bet{.grad_scale = plan.grad_scale, .args = args(plan), .lr = next_lr()};
  const double max_norm = c_.cfg.gradient_clipping;
  if (max_norm > 0) {
    const double scaled_max = max_norm * loss_scale() * averaging();
    bet.abandon_above = scaled_max * scaled_max;
  }
  return bet;
}

optim::StepArgs StepScalars::args(const optim::StepPlan& plan) const {
  optim::StepArgs a;
  a.state_format = c_.cfg.optimizer.moment_format;
  a.copy_dtype = c_.cdt;
  a.grad_scale = static_cast<float>(plan.grad_scale / averaging());
  a.step = taken_ + 1;
  return a;
}

double StepScalars::averaging() const {
  // Gradients carry loss_scale and are summed over ranks and micro-batches: average them.
  const auto accum = c_.cfg.gradient_accumulation_steps > 0 ? c_.cfg.gradient_accumulation_steps : 1;
  return static_cast<double>(c_.world) * static_cast<double>(accum);
}

optim::GradNorm StepScalars::pipeline_norm() const {
  // Every stage's (layer id, bucket, sumsq, finite) for this rank's shards, gathered over the
  // stages and added in layer-id order from zero: the bits one engine holding every layer
  // (registered in id order) adds in its loop over layers.
  std::vector<double> mine;
  for (std::size_t li = 0; li < c_.layout.layers().size(); ++li) {
    const auto& L = c_.layout.layers()[li];
    for (std::size_t k = 0; k < L.buckets.size() && !L.frozen; ++k) {
      const optim::GradNorm g = c_.grads.shard_norm(static_cast<int>(li), k);
      mine.insert(mine.end(), {static_cast<double>(L.id), static_cast<double>(k), g.sumsq, g.finite ? 1.0 : 0.0});
    }
  }
  const auto stages = static_cast<std::size_t>(c_.pipeline->world_size());
  double count = static_cast<double>(mine.size());
  std::vector<double> counts(stages);
  c_.pipeline->all_gather(&count, counts.data(), 2, DType::fp32);  // doubles carried as two fp32 words
  const auto most = static_cast<std::size_t>(*std::max_element(counts.begin(), counts.end()));
  mine.resize(most, -1.0);  // padding: layer id -1
  std::vector<double> all(most * stages);
  c_.pipeline->all_gather(mine.data(), all.data(), 2 * most, DType::fp32);
  std::vector<std::array<double, 4>> entries;
  for (std::size_t i = 0; i + 4 <= all.size(); i += 4) {
    if (all[i] >= 0) entries.push_back({all[i], all[i + 1], all[i + 2], all[i + 3]});
  }
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {  // by (layer id, bucket)
    return a[0] != b[0] ? a[0] < b[0] : a[1] < b[1];
  });
  optim::GradNorm sum;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    STRATA_CHECK(i == 0 || entries[i][0] != entries[i - 1][0] || entries[i][1] != entries[i - 1][1],
                 Errc::invalid_argument, "pipeline: layer ", static_cast<std::int64_t>(entries[i][0]),
                 " is registered on two pipeline stages; each layer belongs to one stage's engine");
    sum += optim::GradNorm{entries[i][2], entries[i][3] != 0.0};
  }
  return sum;
}

optim::GradNorm StepScalars::global_grad_norm() const {
  // 1. This rank's share of the squared norm: its shard of every bucket, in bucket order
  //    (pipeline stages: of every stage's layers, in layer-id order).
  optim::GradNorm local;
  if (c_.pipeline != nullptr && c_.pipeline->world_size() > 1) {
    local = pipeline_norm();
  } else {
    for (std::size_t li = 0; li < c_.layout.layers().size(); ++li) c_.grads.add_shard_norm(static_cast<int>(li), local);
  }
  // 2. Combined in rank order on every rank, so every stage and rank sees the same bits.
  optim::GradNorm global = local;
  if (c_.comm != nullptr && c_.world > 1) {
    double mine[2] = {local.sumsq, local.finite ? 1.0 : 0.0};
    std::vector<double> all(2 * static_cast<std::size_t>(c_.world));
    c_.comm->all_gather(mine, all.data(), 4, DType::fp32);  // 16 bytes as four fp32 words
    global = {};
    for (int r = 0; r < c_.world; ++r) global += optim::GradNorm{all[2 * r], all[2 * r + 1] != 0.0};
  }
  return global;
}

}  // namespace strata::engine
