// `strata plan`'s search as a library call (see plan.h).
#include "train/plan.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <map>
#include <set>

#include "runtime/core/error.h"
#include "runtime/core/units.h"
#include "train/llama.h"
#include "train/output_check.h"

namespace strata::train {
namespace {

void parse_budget(const std::string& text, PlanRequest& r) {
  std::set<std::string> seen;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    const std::size_t end = std::min(text.find(',', pos), text.size());
    const std::string item = text.substr(pos, end - pos);
    const std::size_t eq = item.find('=');
    STRATA_CHECK(eq != std::string::npos, Errc::invalid_argument, "--budget '", text, "': '", item,
                 "' is not TIER=BYTES (for example device=24MiB,host=40MiB,nvme=1GiB)");
    const std::string tier = item.substr(0, eq), bytes = item.substr(eq + 1);
    STRATA_CHECK(seen.insert(tier).second, Errc::invalid_argument, "--budget '", text, "': tier '", tier,
                 "' is given twice: give each tier once");
    const std::string what = "--budget " + tier;
    if (tier == "device") {
      r.device_budget = parse_bytes(bytes, what);
    } else if (tier == "host") {
      r.host_budget = parse_bytes(bytes, what);
    } else if (tier == "nvme") {
      r.nvme_budget = parse_bytes(bytes, what);
    } else {
      STRATA_THROW(Errc::invalid_argument, "--budget '", text, "': tier '", tier, "' is not device, host or nvme");
    }
    pos = end + 1;
  }
  STRATA_CHECK(seen.count("device") && seen.count("host"), Errc::invalid_argument, "--budget '", text,
               "' must give the device and the host (for example device=24MiB,host=40MiB)");
  STRATA_CHECK(r.nvme_budget == 0 || !r.nvme_path.empty(), Errc::invalid_argument,
               "--budget nvme needs --nvme-path DIR: the directory on the NVMe device for swap files");
}

nlohmann::json base_config(const PlanOptions& o) {
  if (o.config.empty()) {
    return {{"bf16", {{"enabled", true}}},
            {"gradient_clipping", 1.0},
            {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}, {"weight_decay", 0.01}}}}},
            {"zero_optimization", {{"stage3_param_persistence_threshold", 0}}}};
  }
  std::ifstream in(o.config);
  STRATA_CHECK(in.good(), Errc::io, "--config '", o.config, "' cannot be read");
  const nlohmann::json j = nlohmann::json::parse(
      std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()), nullptr, false);
  STRATA_CHECK(!j.is_discarded() && j.is_object(), Errc::invalid_argument, "--config '", o.config,
               "' is not a JSON object");
  return j;
}

nlohmann::json candidate_json(const Candidate& c, double tokens, const Traffic& t) {
  return {{"label", c.label()},
          {"h2d_bytes_per_step", t.h2d},
          {"d2h_bytes_per_step", t.d2h},
          {"nvme_read_bytes_per_step", t.nvme_read},
          {"nvme_write_bytes_per_step", t.nvme_write},
          {"nvme_write_bytes_per_day", t.nvme_write_per_day},
          {"drive_endurance_days", t.endurance_days},
          {"stage", c.stage},
          {"optimizer", c.optimizer},
          {"params", c.params},
          {"micro_batch", c.micro},
          {"accumulation", c.accum},
          {"remat", c.remat},
          {"step_ms", c.time.total() * 1e3},
          {"tokens_per_s", tokens / c.time.total()},
          {"compute_ms", c.time.compute * 1e3},
          {"gradients_ms", c.time.gradients * 1e3},
          {"optimizer_ms", c.time.optimizer * 1e3},
          {"link_ms", c.time.link * 1e3},
          {"nvme_ms", c.time.nvme * 1e3},
          {"comm_ms", c.time.comm * 1e3},
          {"device_peak", c.device_total},
          {"host_peak", c.estimate.tiers[1].total()},
          {"nvme_peak", c.estimate.tiers[2].total()},
          {"config", c.config}};
}

}  // namespace

Traffic traffic_of(const Candidate& c, int local_ranks, double drive_tbw) {
  Traffic t{c.estimate.h2d_bytes, c.estimate.d2h_bytes, c.estimate.nvme_read_bytes, c.estimate.nvme_write_bytes};
  t.nvme_write_per_day = static_cast<double>(t.nvme_write) * local_ranks * 86400.0 / c.time.total();
  if (drive_tbw > 0 && t.nvme_write_per_day > 0) t.endurance_days = drive_tbw * 1e12 / t.nvme_write_per_day;
  return t;
}

std::string model_flags(const ModelOptions& m) {
  std::string f;
  if (!m.preset.empty()) f += " --preset " + m.preset;
  auto add = [&f](const char* flag, int v) {
    if (v > 0) f += str_cat(" ", flag, " ", v);
  };
  add("--layers", m.layers);
  add("--heads", m.heads);
  add("--d-model", m.d_model);
  add("--seq-len", m.seq_len);
  add("--positions", m.positions);
  add("--vocab", m.vocab);
  return f;
}

Plan make_plan(const PlanOptions& o, const PassProfiler& profile) {
  const bool hf = is_hf_model_dir(o.m.model);
  STRATA_CHECK(o.m.model == "gpt" || hf, Errc::invalid_argument, "--model ", o.m.model,
               ": strata plan sizes the GPT (--model gpt) and Hugging Face directories (--model DIR); the demo MLP "
               "has no pass to profile");
  Plan plan;
  plan.drive_tbw = o.drive_tbw;
  PlanRequest& r = plan.request;
  r.model = o.m;
  r.nvme_path = o.nvme_path;
  r.world = o.world;
  r.local_ranks = o.local_ranks > 0 ? o.local_ranks : o.world;
  STRATA_CHECK(r.local_ranks <= r.world, Errc::invalid_argument, "--local-ranks ", r.local_ranks, " is above --world ",
               r.world);
  parse_budget(o.budget, r);
  r.base = base_config(o);
  const int base_batch =
      r.base.value("train_micro_batch_size_per_gpu", 0) * r.base.value("gradient_accumulation_steps", 1);
  r.batch = o.batch > 0 ? o.batch : base_batch > 0 ? base_batch : 8;
  if (!o.emit.empty()) check_output_file("--emit-config", o.emit);
  plan.calibration = load_calibration(o.calibration);

  std::vector<Candidate> all = plan_candidates(r);
  plan.candidates = all.size();
  for (auto& c : all)
    if (c.refusal.empty()) plan.fit.push_back(std::move(c));
  if (plan.fit.empty()) {
    const auto least = smallest_budgets(r);
    std::string what;
    const char* names[3] = {"device", "host", "nvme"};
    for (int t = 0; t < 3; ++t)
      if (least[t])
        what += str_cat(what.empty() ? "" : ", or ", names[t], "=", format_bytes(least[t]), " (", least[t], " B)");
    STRATA_THROW(Errc::out_of_budget,
                 "no stage, placement, micro-batch or re-materialization of the model fits "
                 "--budget ",
                 o.budget,
                 what.empty() ? std::string(": no budget of one tier alone makes it fit; raise several")
                              : str_cat(": raise --budget to ", what, " (the other tiers as given)"));
  }
  std::map<std::pair<int, std::string>, double> pass;  // profiled seconds per (micro, remat)
  for (auto& c : plan.fit) {
    const auto key = std::make_pair(c.micro, c.remat);
    if (!pass.count(key)) pass[key] = profile(c.micro, c.remat, c.compute == DType::bf16 ? "bf16" : "fp32");
    c.time = predict_step(plan.calibration, c, r, pass[key]);
  }
  std::stable_sort(plan.fit.begin(), plan.fit.end(),
                   [](const Candidate& a, const Candidate& b) { return a.time.total() < b.time.total(); });
  const int seq = hf ? llama_config(o.m, false).seq_len : gpt_config(o.m, false).seq_len;
  plan.tokens = static_cast<double>(r.batch) * seq * r.world;
  if (!o.emit.empty()) {
    std::ofstream f(o.emit, std::ios::trunc);
    f << plan.fit.front().config.dump(2) << "\n";
    f.close();
    STRATA_CHECK(f.good(), Errc::io, "--emit-config '", o.emit, "': writing failed (disk full?)");
  }
  return plan;
}

nlohmann::json Plan::json(int top) const {
  nlohmann::json j{
      {"fitting", fit.size()}, {"candidates", candidates}, {"batch", request.batch}, {"world", request.world}};
  for (std::size_t k = 0; k < fit.size() && k < static_cast<std::size_t>(top); ++k)
    j["best"].push_back(candidate_json(fit[k], tokens, traffic(k)));
  return j;
}

}  // namespace strata::train
