// Schedule construction helpers (communication insertion) and its text/CSV forms.
#include "pipeline/schedule.h"

#include <charconv>
#include <sstream>

#include "runtime/core/error.h"

namespace strata::pipeline {
namespace {

std::vector<std::string_view> split(std::string_view text, char sep) {
  std::vector<std::string_view> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t end = text.find(sep, start);
    const std::size_t stop = end == std::string_view::npos ? text.size() : end;
    out.push_back(text.substr(start, stop - start));
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

int to_int(std::string_view text, int line, const char* what) {
  int v = 0;
  text = trim(text);
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  STRATA_CHECK(ec == std::errc() && ptr == text.data() + text.size(), Errc::invalid_argument, "schedule line ", line,
               ": ", what, " '", text, "' is not an integer");
  return v;
}

void check_shape(const Schedule& s) {
  STRATA_CHECK(s.stages >= 1 && s.micro_batches >= 1 && s.chunks >= 1, Errc::invalid_argument,
               "schedule header: stages=", s.stages, " micro=", s.micro_batches, " chunks=", s.chunks,
               " must all be at least 1");
  STRATA_CHECK(s.stages <= 4096 && s.chunks <= 64 && s.micro_batches <= (1 << 20), Errc::invalid_argument,
               "schedule header: stages=", s.stages, " micro=", s.micro_batches, " chunks=", s.chunks,
               " is beyond what Strata schedules (4096 stages, 64 chunks, 2^20 micro-batches)");
}

// "strata-schedule v1 kind=X stages=P micro=M chunks=V"
Schedule parse_header(std::string_view line) {
  Schedule s;
  s.kind = "custom";
  bool has_stages = false, has_micro = false;
  const auto words = split(trim(line), ' ');
  STRATA_CHECK(words.size() >= 2 && words[0] == "strata-schedule" && words[1] == "v1", Errc::invalid_argument,
               "schedule line 1 '", line, "' is not a 'strata-schedule v1 ...' header");
  for (std::size_t i = 2; i < words.size(); ++i) {
    if (words[i].empty()) continue;
    const auto eq = words[i].find('=');
    STRATA_CHECK(eq != std::string_view::npos, Errc::invalid_argument, "schedule header: '", words[i],
                 "' is not key=value");
    const auto key = words[i].substr(0, eq), value = words[i].substr(eq + 1);
    if (key == "kind")
      s.kind = std::string(value);
    else if (key == "stages")
      s.stages = to_int(value, 1, "stages"), has_stages = true;
    else if (key == "micro")
      s.micro_batches = to_int(value, 1, "micro"), has_micro = true;
    else if (key == "chunks")
      s.chunks = to_int(value, 1, "chunks");
    else
      STRATA_THROW(Errc::invalid_argument, "schedule header: unknown key '", key, "' (kind, stages, micro, chunks)");
  }
  STRATA_CHECK(has_stages && has_micro, Errc::invalid_argument, "schedule header '", line,
               "' must give stages= and micro=");
  check_shape(s);
  s.actions.assign(s.stages, {});
  return s;
}

Schedule parse_text(const std::vector<std::string_view>& lines) {
  Schedule s = parse_header(lines[0]);
  std::vector<bool> seen(s.stages, false);
  for (std::size_t i = 1; i < lines.size(); ++i) {
    const int n = static_cast<int>(i) + 1;
    const auto line = trim(lines[i]);
    if (line.empty() || line.front() == '#') continue;
    const auto colon = line.find(':');
    STRATA_CHECK(line.substr(0, 6) == "stage " && colon != std::string_view::npos, Errc::invalid_argument,
                 "schedule line ", n, " '", line.substr(0, 40), "' is not 'stage N: ACTIONS'");
    const int stage = to_int(line.substr(6, colon - 6), n, "stage");
    STRATA_CHECK(stage >= 0 && stage < s.stages, Errc::invalid_argument, "schedule line ", n, ": stage ", stage,
                 " is outside 0..", s.stages - 1);
    STRATA_CHECK(!seen[stage], Errc::invalid_argument, "schedule line ", n, ": stage ", stage, " is listed twice");
    seen[stage] = true;
    for (auto tok : split(line.substr(colon + 1), ' ')) {
      tok = trim(tok);
      if (tok.empty()) continue;
      try {
        s.actions[stage].push_back(parse_action(tok));
      } catch (const Error& e) {
        STRATA_THROW(Errc::invalid_argument, "schedule line ", n, ": ", e.what());
      }
    }
  }
  return s;
}

Schedule parse_csv(const std::vector<std::string_view>& lines) {
  // Line 1: "# strata-schedule v1 ..." header; line 2: column names; then rows.
  Schedule s = parse_header(trim(lines[0]).substr(2));
  for (std::size_t i = 1; i < lines.size(); ++i) {
    const int n = static_cast<int>(i) + 1;
    const auto line = trim(lines[i]);
    if (line.empty() || line.substr(0, 6) == "stage,") continue;
    const auto cols = split(line, ',');
    STRATA_CHECK(cols.size() == 7, Errc::invalid_argument, "schedule line ", n, ": ", cols.size(),
                 " columns, expected 7 (stage,index,action,kind,micro,chunk,peer)");
    const int stage = to_int(cols[0], n, "stage");
    STRATA_CHECK(stage >= 0 && stage < s.stages, Errc::invalid_argument, "schedule line ", n, ": stage ", stage,
                 " is outside 0..", s.stages - 1);
    const int index = to_int(cols[1], n, "index");
    STRATA_CHECK(index == static_cast<int>(s.actions[stage].size()), Errc::invalid_argument, "schedule line ", n,
                 ": index ", index, " on stage ", stage, " is out of order (expected ", s.actions[stage].size(), ")");
    try {
      s.actions[stage].push_back(parse_action(trim(cols[2])));
    } catch (const Error& e) {
      STRATA_THROW(Errc::invalid_argument, "schedule line ", n, ": ", e.what());
    }
  }
  return s;
}

}  // namespace

std::size_t Schedule::compute_count() const {
  std::size_t n = 0;
  for (const auto& list : actions) {
    for (const auto& a : list) n += is_compute(a.kind) ? 1 : 0;
  }
  return n;
}

Schedule add_communication(std::string kind, int stages, int micro_batches, int chunks,
                           const std::vector<std::vector<Action>>& compute) {
  Schedule s;
  s.kind = std::move(kind);
  s.stages = stages;
  s.micro_batches = micro_batches;
  s.chunks = chunks;
  check_shape(s);
  STRATA_CHECK(static_cast<int>(compute.size()) == stages, Errc::invalid_argument,
               "add_communication: ", compute.size(), " compute lists for ", stages, " stages");
  s.actions.assign(stages, {});
  const int last = s.virtual_stages() - 1;
  for (int st = 0; st < stages; ++st) {
    auto& out = s.actions[st];
    for (const Action& a : compute[st]) {
      STRATA_CHECK(is_compute(a.kind), Errc::invalid_argument, "add_communication: stage ", st, " lists ",
                   format_action(a), ", which is not a compute action");
      const int vs = s.virtual_stage(st, a.chunk);
      const bool prev_remote = vs > 0 && s.stage_of(vs - 1) != st;
      const bool next_remote = vs < last && s.stage_of(vs + 1) != st;
      const int prev_stage = vs > 0 ? s.stage_of(vs - 1) : -1;
      const int next_stage = vs < last ? s.stage_of(vs + 1) : -1;
      const bool backward = a.kind == ActionKind::backward_input || a.kind == ActionKind::backward_full;
      if (a.kind == ActionKind::forward && prev_remote)
        out.push_back({ActionKind::recv_activation, a.micro, a.chunk, prev_stage});
      if (backward && next_remote) out.push_back({ActionKind::recv_gradient, a.micro, a.chunk, next_stage});
      out.push_back(a);
      if (a.kind == ActionKind::forward && next_remote)
        out.push_back({ActionKind::send_activation, a.micro, a.chunk, next_stage});
      if (backward && prev_remote) out.push_back({ActionKind::send_gradient, a.micro, a.chunk, prev_stage});
    }
    out.push_back({ActionKind::optimizer_step, 0, 0, -1});
  }
  return s;
}

std::vector<std::vector<Action>> compute_order(const Schedule& s) {
  std::vector<std::vector<Action>> out(s.actions.size());
  for (std::size_t st = 0; st < s.actions.size(); ++st) {
    for (const auto& a : s.actions[st]) {
      if (is_compute(a.kind)) out[st].push_back(a);
    }
  }
  return out;
}

std::string to_text(const Schedule& s) {
  std::ostringstream os;
  os << "strata-schedule v1 kind=" << s.kind << " stages=" << s.stages << " micro=" << s.micro_batches
     << " chunks=" << s.chunks << "\n";
  for (std::size_t st = 0; st < s.actions.size(); ++st) {
    os << "stage " << st << ":";
    for (const auto& a : s.actions[st]) os << ' ' << format_action(a);
    os << "\n";
  }
  return os.str();
}

std::string to_csv(const Schedule& s) {
  std::ostringstream os;
  os << "# strata-schedule v1 kind=" << s.kind << " stages=" << s.stages << " micro=" << s.micro_batches
     << " chunks=" << s.chunks << "\n";
  os << "stage,index,action,kind,micro,chunk,peer\n";
  for (std::size_t st = 0; st < s.actions.size(); ++st) {
    for (std::size_t i = 0; i < s.actions[st].size(); ++i) {
      const auto& a = s.actions[st][i];
      os << st << ',' << i << ',' << format_action(a) << ',' << action_kind_name(a.kind) << ',' << a.micro << ','
         << a.chunk << ',' << a.peer << "\n";
    }
  }
  return os.str();
}

Schedule parse_schedule(std::string_view text) {
  auto lines = split(text, '\n');
  while (!lines.empty() && trim(lines.back()).empty()) lines.pop_back();
  STRATA_CHECK(!lines.empty(), Errc::invalid_argument,
               "schedule text is empty: expected a 'strata-schedule v1' header");
  const auto first = trim(lines[0]);
  if (first.substr(0, 2) == "# ") return parse_csv(lines);
  return parse_text(lines);
}

}  // namespace strata::pipeline
