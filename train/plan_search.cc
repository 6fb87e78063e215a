// See plan_search.h.
#include "train/plan_search.h"

#include <algorithm>

#include "engine/config.h"
#include "runtime/core/error.h"
#include "runtime/core/log.h"
#include "runtime/core/units.h"

namespace strata::train {
namespace {

struct Shape {  // one placement of the search
  int stage;
  std::string optimizer, params;
};

std::vector<Shape> placements(bool nvme) {
  std::vector<std::string> offload{"none", "cpu"};
  if (nvme) offload.push_back("nvme");
  std::vector<Shape> out{{0, "none", "none"}};
  for (int stage = 1; stage <= 3; ++stage) {
    for (const auto& opt : offload) {
      if (stage < 3) {
        out.push_back({stage, opt, "none"});
        continue;
      }
      for (const auto& par : offload) out.push_back({stage, opt, par});
    }
  }
  return out;
}

std::vector<int> micro_batches(int batch) {
  std::vector<int> out;
  for (int m = 1; m <= batch; m *= 2)
    if (batch % m == 0) out.push_back(m);
  if (out.back() != batch) out.push_back(batch);
  return out;
}

nlohmann::json candidate_config(const PlanRequest& r, const Shape& s, int micro, const std::string& remat) {
  nlohmann::json c = r.base;
  c.erase("train_batch_size");
  c["train_micro_batch_size_per_gpu"] = micro;
  c["gradient_accumulation_steps"] = r.batch / micro;
  nlohmann::json& z = c["zero_optimization"];
  if (!z.is_object()) z = nlohmann::json::object();
  z["stage"] = s.stage;
  // The base's offload settings (buffer counts and sizes, pinning) stay; the search sets the
  // devices and the path.
  auto offload = [&](const char* key, const std::string& device) {
    nlohmann::json& o = z[key];
    if (!o.is_object()) o = nlohmann::json::object();
    o["device"] = device;
    if (!r.nvme_path.empty()) o["nvme_path"] = r.nvme_path;
  };
  if (s.stage >= 1) offload("offload_optimizer", s.optimizer);
  if (s.stage == 3) offload("offload_param", s.params);
  if (s.stage < 1) z.erase("offload_optimizer");
  if (s.stage < 3) z.erase("offload_param");
  nlohmann::json budget = {{"device", r.device_budget}, {"host", r.host_budget}};
  if (r.nvme_budget) budget["nvme"] = r.nvme_budget;
  c["memory_budget"] = budget;
  if (remat == "always") {
    c["activation_checkpointing"] = {{"partition_activations", false}};
  } else {
    c.erase("activation_checkpointing");
  }
  return c;
}

// Fills the estimate of one candidate, or its refusal.
void size_candidate(const PlanRequest& r, Candidate& c) {
  try {
    engine::ModelFacts facts;
    facts.world_size = r.world;
    facts.total_steps = 1;
    ModelOptions m = r.model;
    m.remat = c.remat;
    facts.hidden_size = model_hidden_size(m);
    engine::EstimateInput in;
    in.config = engine::parse_config(c.config.dump(), "strata plan's candidate", facts);
    const ModelSize size = model_size(m, in.config);
    STRATA_CHECK(size.min_device_bytes <= r.device_budget, Errc::out_of_budget, size.describe, " needs ",
                 format_bytes(size.min_device_bytes), " of device memory itself (activations and one block)");
    in.params = size.params;
    in.world = r.world;
    in.device_budget = r.device_budget;
    in.trainer_device_bytes = size.device_bytes;
    c.compute = engine::compute_dtype_of(in.config);
    auto estimate = [&] {
      c.estimate = engine::estimate_memory(in);
      c.device_total = c.estimate.tiers[0].total() + c.estimate.trainer_device_bytes;
    };
    estimate();
    // Headroom on the device against fragmentation: a full device can hold the bytes of the
    // largest gradient buffer in pieces too small for it, so a plan leaves that much free. At
    // stage 3, where the gathered window fills what the device leaves, it narrows the window
    // (stage3_max_live_parameters) by what is missing.
    const std::uint64_t cb = dtype_size(c.compute);
    const std::uint64_t slack = c.estimate.largest_layer_padded * cb;
    const std::uint64_t want = r.device_budget > slack ? r.device_budget - slack : 0;
    if (c.device_total > want && c.estimate.window_elems > 0) {
      const std::uint64_t cut = (c.device_total - want + cb - 1) / cb;
      if (c.estimate.window_elems > cut + c.estimate.largest_layer_padded) {
        c.config["zero_optimization"]["stage3_max_live_parameters"] = c.estimate.window_elems - cut;
        in.config = engine::parse_config(c.config.dump(), "strata plan's candidate", facts);
        estimate();
      }
    }
    STRATA_CHECK(c.device_total <= want, Errc::out_of_budget, "device peak ", format_bytes(c.device_total),
                 " leaves less than the largest gradient buffer (", format_bytes(slack), ") of the budget free");
    // Headroom on the host: at a full host tier a gather's staging can come before a write-back
    // frees its own (the estimate counts them apart), so a plan keeps 5% of that budget free.
    STRATA_CHECK(c.estimate.tiers[1].total() <= r.host_budget / 20 * 19, Errc::out_of_budget, "host peak ",
                 format_bytes(c.estimate.tiers[1].total()), " leaves less than 5% of the budget free");
  } catch (const Error& e) {
    if (e.code() != Errc::out_of_budget && e.code() != Errc::invalid_argument) throw;
    c.refusal = e.what();
  }
}

Candidate make_candidate(const PlanRequest& r, const Shape& s, int micro, const std::string& remat) {
  Candidate c;
  c.stage = s.stage;
  c.optimizer = s.optimizer;
  c.params = s.params;
  c.micro = micro;
  c.accum = r.batch / micro;
  c.remat = remat;
  c.config = candidate_config(r, s, micro, remat);
  size_candidate(r, c);
  return c;
}

// Candidates repeat the config's notices: errors only while it lives.
struct QuietLog {
  QuietLog() : level(log_level()) { set_log_level(std::min(level, LogLevel::error)); }
  ~QuietLog() { set_log_level(level); }
  QuietLog(const QuietLog&) = delete;
  QuietLog& operator=(const QuietLog&) = delete;
  LogLevel level;
};

bool any_fits(const PlanRequest& r) {
  const QuietLog quiet;
  for (const auto& s : placements(!r.nvme_path.empty()))
    if (make_candidate(r, s, 1, "always").refusal.empty()) return true;
  return false;
}

}  // namespace

std::string Candidate::label() const {
  auto place = [](const std::string& d) { return d == "none" ? std::string("auto") : d; };
  return str_cat("stage ", stage, ", optimizer ", stage == 0 ? "device" : place(optimizer), ", params ",
                 stage == 3 ? place(params) : "device", ", ", micro, " x ", accum, ", remat ", remat);
}

std::vector<Candidate> plan_candidates(const PlanRequest& r) {
  STRATA_CHECK(r.batch >= 1, Errc::invalid_argument, "--batch ", r.batch, " must be >= 1");
  std::vector<Candidate> out;
  // The config's notices once, for the first candidate; the others differ only in the keys
  // the search sets.
  make_candidate(r, placements(false).front(), 1, "never");
  const QuietLog quiet;
  for (const auto& s : placements(!r.nvme_path.empty()))
    for (int micro : micro_batches(r.batch))
      for (const char* remat : {"never", "always"}) out.push_back(make_candidate(r, s, micro, remat));
  return out;
}

StepTime predict_step(const Calibration& cal, const Candidate& c, const PlanRequest& r, double pass_seconds) {
  const engine::MemoryEstimate& e = c.estimate;
  StepTime t;
  const double shared = r.local_ranks;  // the ranks on this host take turns on its cores
  t.compute = shared * c.accum * pass_seconds;
  t.gradients = shared * c.accum * static_cast<double>(e.params) * cal.grad_path_ns_per_elem * 1e-9;
  t.optimizer = shared * static_cast<double>(e.optimizer_elems) / cal.adam_params_per_s;
  t.link =
      static_cast<double>(e.h2d_bytes) / (cal.h2d_gbps * 1e9) + static_cast<double>(e.d2h_bytes) / (cal.d2h_gbps * 1e9);
  t.nvme = static_cast<double>(e.nvme_read_bytes) / (cal.nvme_read_gbps * 1e9) +
           static_cast<double>(e.nvme_write_bytes) / (cal.nvme_write_gbps * 1e9);
  if (r.world > 1) {
    // Bus bytes: a reduce-scatter or all-gather of S moves S (n-1)/n, an all-reduce twice that.
    const double n = r.world, share = (n - 1) / n, P = static_cast<double>(e.params);
    const double cb = static_cast<double>(dtype_size(c.compute));
    const double grads = c.accum * 4.0 * P * share;  // fp32 gradients, every micro-batch
    t.comm =
        c.stage >= 2 ? grads / (cal.reduce_scatter_busbw_gbps * 1e9) : 2 * grads / (cal.all_reduce_busbw_gbps * 1e9);
    const double gathers = c.stage == 3 ? 2.0 * c.accum : c.stage >= 1 ? 1.0 : 0.0;
    t.comm += gathers * cb * P * share / (cal.all_gather_busbw_gbps * 1e9);
  }
  return t;
}

std::vector<std::uint64_t> smallest_budgets(const PlanRequest& r) {
  std::vector<std::uint64_t> out(3, 0);
  for (int tier = 0; tier < 3; ++tier) {
    if (tier == 2 && (r.nvme_path.empty() || r.nvme_budget == 0)) continue;  // 0: unlimited
    PlanRequest q = r;
    std::uint64_t& b = tier == 0 ? q.device_budget : tier == 1 ? q.host_budget : q.nvme_budget;
    std::uint64_t lo = tier == 0 ? r.device_budget : tier == 1 ? r.host_budget : r.nvme_budget;
    std::uint64_t hi = std::max<std::uint64_t>(lo, 1 << 20);
    for (b = hi; !any_fits(q); b = hi) {
      if (hi > (std::uint64_t{1} << 50)) break;
      lo = hi;
      hi *= 2;
    }
    if (hi > (std::uint64_t{1} << 50)) continue;
    while (hi - lo > std::max<std::uint64_t>(hi / 1024, 4096)) {  // within 0.1%
      b = lo + (hi - lo) / 2;
      (any_fits(q) ? hi : lo) = b;
    }
    out[tier] = hi;
  }
  return out;
}

}  // namespace strata::train
