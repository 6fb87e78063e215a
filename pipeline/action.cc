// Action tokens (see action.h): KIND MICRO [":" CHUNK] [(">"|"<") PEER], or "OPT".
#include "pipeline/action.h"

#include <charconv>

#include "runtime/core/error.h"

namespace strata::pipeline {
namespace {

struct KindInfo {
  ActionKind kind;
  const char* token;
  const char* name;
};

// Longest tokens first so "BW" is not read as "B" followed by garbage.
constexpr KindInfo kKinds[] = {
    {ActionKind::optimizer_step, "OPT", "optimizer_step"},
    {ActionKind::backward_full, "BW", "backward_full"},
    {ActionKind::send_activation, "SA", "send_activation"},
    {ActionKind::recv_activation, "RA", "recv_activation"},
    {ActionKind::send_gradient, "SG", "send_gradient"},
    {ActionKind::recv_gradient, "RG", "recv_gradient"},
    {ActionKind::forward, "F", "forward"},
    {ActionKind::backward_input, "B", "backward_input"},
    {ActionKind::backward_weight, "W", "backward_weight"},
};

const KindInfo& info(ActionKind k) {
  for (const auto& i : kKinds) {
    if (i.kind == k) return i;
  }
  return kKinds[0];
}

[[noreturn]] void bad_token(std::string_view token, const char* why) {
  STRATA_THROW(Errc::invalid_argument, "schedule action '", token, "' ", why,
               ": write F3, B3, W3, BW3 (micro-batch 3), F3:1 (chunk 1), SA3>2 / RA3<0 / SG3<0 / RG3>2 "
               "(send to / receive from a stage), or OPT");
}

int parse_int(std::string_view token, std::string_view& rest, const char* what) {
  int v = 0;
  const auto [ptr, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), v);
  if (ec != std::errc() || ptr == rest.data() || v < 0) bad_token(token, what);
  rest.remove_prefix(static_cast<std::size_t>(ptr - rest.data()));
  return v;
}

}  // namespace

const char* action_kind_token(ActionKind k) noexcept { return info(k).token; }
const char* action_kind_name(ActionKind k) noexcept { return info(k).name; }

bool is_compute(ActionKind k) noexcept {
  return k == ActionKind::forward || k == ActionKind::backward_input || k == ActionKind::backward_weight ||
         k == ActionKind::backward_full;
}

bool is_comm(ActionKind k) noexcept {
  return k == ActionKind::send_activation || k == ActionKind::recv_activation || k == ActionKind::send_gradient ||
         k == ActionKind::recv_gradient;
}

std::string format_action(const Action& a) {
  if (a.kind == ActionKind::optimizer_step) return "OPT";
  std::string s = action_kind_token(a.kind);
  s += std::to_string(a.micro);
  if (a.chunk != 0) s += ":" + std::to_string(a.chunk);
  if (is_comm(a.kind)) {
    const bool sends = a.kind == ActionKind::send_activation || a.kind == ActionKind::send_gradient;
    s += sends ? ">" : "<";
    s += std::to_string(a.peer);
  }
  return s;
}

Action parse_action(std::string_view token) {
  Action a;
  std::string_view rest = token;
  const KindInfo* found = nullptr;
  for (const auto& i : kKinds) {
    const std::string_view t = i.token;
    if (rest.substr(0, t.size()) == t) {
      found = &i;
      break;
    }
  }
  if (found == nullptr) bad_token(token, "has no known kind");
  a.kind = found->kind;
  rest.remove_prefix(std::string_view(found->token).size());
  if (a.kind == ActionKind::optimizer_step) {
    if (!rest.empty()) bad_token(token, "has text after OPT");
    return a;
  }
  a.micro = parse_int(token, rest, "has no micro-batch number");
  if (!rest.empty() && rest.front() == ':') {
    rest.remove_prefix(1);
    a.chunk = parse_int(token, rest, "has no chunk number after ':'");
  }
  if (is_comm(a.kind)) {
    const bool sends = a.kind == ActionKind::send_activation || a.kind == ActionKind::send_gradient;
    if (rest.empty() || rest.front() != (sends ? '>' : '<'))
      bad_token(token, sends ? "needs '>PEER'" : "needs '<PEER'");
    rest.remove_prefix(1);
    a.peer = parse_int(token, rest, "has no peer stage");
  }
  if (!rest.empty()) bad_token(token, "has trailing text");
  return a;
}

}  // namespace strata::pipeline
