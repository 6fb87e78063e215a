// Timeline figures and the Chrome trace writer (see timeline.h).
#include "pipeline/timeline.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "runtime/core/error.h"

namespace strata::pipeline {

TimelineStats summarize(const Timeline& t) {
  TimelineStats st;
  const int p = t.stages;
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> first(p, inf), last(p, -inf);
  st.busy.assign(p, 0.0);
  st.peak_activations.assign(p, 0.0);
  // Activation events per stage: +1/v at an F's start, -1/v at a W's or BW's end.
  std::vector<std::vector<std::pair<double, int>>> events(p);
  for (const auto& ta : t.actions) {
    const ActionKind k = ta.action.kind;
    if (!is_compute(k) && k != ActionKind::optimizer_step) continue;
    STRATA_CHECK(ta.stage >= 0 && ta.stage < p, Errc::invalid_argument, "timeline: action on stage ", ta.stage, " of ",
                 p);
    first[ta.stage] = std::min(first[ta.stage], ta.start);
    last[ta.stage] = std::max(last[ta.stage], ta.end);
    st.busy[ta.stage] += ta.end - ta.start;
    if (k == ActionKind::forward) events[ta.stage].push_back({ta.start, +1});
    if (k == ActionKind::backward_weight || k == ActionKind::backward_full) events[ta.stage].push_back({ta.end, -1});
  }
  st.span.assign(p, 0.0);
  for (int s = 0; s < p; ++s) {
    if (first[s] <= last[s]) st.span[s] = last[s] - first[s];
    st.makespan = std::max(st.makespan, st.span[s]);
    // At equal times frees go first: an F that starts as a W ends reuses its memory.
    auto& ev = events[s];
    std::sort(ev.begin(), ev.end(), [](const auto& a, const auto& b) {
      return a.first < b.first || (a.first == b.first && a.second < b.second);
    });
    int live = 0, peak = 0;
    for (const auto& e : ev) {
      live += e.second;
      peak = std::max(peak, live);
    }
    st.peak_activations[s] = static_cast<double>(peak) / t.chunks;
  }
  st.bubble_rate_per_stage.assign(p, 0.0);
  double busy_sum = 0;
  for (int s = 0; s < p; ++s) {
    busy_sum += st.busy[s];
    if (st.makespan > 0) st.bubble_rate_per_stage[s] = (st.makespan - st.busy[s]) / st.makespan;
  }
  if (st.makespan > 0) st.bubble_rate = 1.0 - busy_sum / p / st.makespan;
  return st;
}

std::string to_chrome_trace(const Timeline& t) {
  using nlohmann::json;
  json events = json::array();
  for (int s = 0; s < t.stages; ++s) {
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", 0},
                      {"tid", s},
                      {"args", {{"name", "stage " + std::to_string(s)}}}});
    events.push_back(
        {{"name", "thread_sort_index"}, {"ph", "M"}, {"pid", 0}, {"tid", s}, {"args", {{"sort_index", s}}}});
  }
  events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", 0}, {"args", {{"name", "pipeline " + t.kind}}}});
  for (const auto& ta : t.actions) {
    const ActionKind k = ta.action.kind;
    const bool recv = k == ActionKind::recv_activation || k == ActionKind::recv_gradient;
    if (!is_compute(k) && k != ActionKind::optimizer_step && !(recv && ta.end > ta.start)) continue;
    json e = {{"name", format_action(ta.action)},
              {"cat", action_kind_name(k)},
              {"ph", "X"},
              {"pid", 0},
              {"tid", ta.stage},
              {"ts", ta.start * t.unit_us},
              {"dur", (ta.end - ta.start) * t.unit_us},
              {"args", {{"micro", ta.action.micro}, {"chunk", ta.action.chunk}}}};
    if (recv) e["args"]["wait_for_stage"] = ta.action.peer;
    events.push_back(std::move(e));
  }
  json doc = {{"traceEvents", std::move(events)},
              {"displayTimeUnit", "ms"},
              {"otherData",
               {{"kind", t.kind},
                {"stages", t.stages},
                {"micro_batches", t.micro_batches},
                {"chunks", t.chunks},
                {"unit", t.unit}}}};
  return doc.dump(1);
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  STRATA_CHECK(f.good(), Errc::io, "cannot open '", path, "' for writing: ", errno_text(errno));
  f.write(text.data(), static_cast<std::streamsize>(text.size()));
  f.close();
  STRATA_CHECK(f.good(), Errc::io, "writing '", path, "' failed: ", errno_text(errno));
}

}  // namespace strata::pipeline
