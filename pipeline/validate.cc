// The schedule validator (see simulate.h): static checks on each stage's list, then a
// replay that finds deadlocks.
#include <algorithm>
#include <sstream>

#include "pipeline/detail/replay.h"
#include "pipeline/simulate.h"
#include "runtime/core/error.h"

namespace strata::pipeline {
namespace {

constexpr std::size_t kMaxErrors = 20;

// Positions of one stage's actions, per (micro-batch, chunk); -1 when absent.
struct StageIndex {
  int v = 1;
  std::vector<int> f, b, w, bw, sa, ra, sg, rg;
  explicit StageIndex(int m, int chunks) : v(chunks) {
    const std::size_t n = static_cast<std::size_t>(m) * chunks;
    for (auto* x : {&f, &b, &w, &bw, &sa, &ra, &sg, &rg}) x->assign(n, -1);
  }
  std::size_t at(int micro, int chunk) const { return static_cast<std::size_t>(micro) * v + chunk; }
  std::vector<int>& of(ActionKind k) {
    switch (k) {
      case ActionKind::forward:
        return f;
      case ActionKind::backward_input:
        return b;
      case ActionKind::backward_weight:
        return w;
      case ActionKind::backward_full:
        return bw;
      case ActionKind::send_activation:
        return sa;
      case ActionKind::recv_activation:
        return ra;
      case ActionKind::send_gradient:
        return sg;
      default:
        return rg;
    }
  }
};

class Checker {
 public:
  explicit Checker(const Schedule& s) : s_(s) {}

  ValidationReport run() {
    check_header();
    if (!report_.ok()) return std::move(report_);
    check_counts();
    if (!report_.ok()) return std::move(report_);
    for (int st = 0; st < s_.stages; ++st) index_.emplace_back(s_.micro_batches, s_.chunks);
    for (int st = 0; st < s_.stages; ++st) index_stage(st);
    if (!report_.ok()) return std::move(report_);
    for (int st = 0; st < s_.stages; ++st) check_stage(st);
    if (!report_.ok()) return std::move(report_);
    Timeline scratch;
    const std::string stuck = detail::replay(s_, Costs::uniform(0, 0, 0), scratch);
    if (!stuck.empty()) add("deadlock: ", stuck);
    return std::move(report_);
  }

 private:
  template <class... A> void add(A&&... parts) {
    if (report_.errors.size() < kMaxErrors) report_.errors.push_back(str_cat(std::forward<A>(parts)...));
  }

  void check_header() {
    if (s_.stages < 1 || s_.micro_batches < 1 || s_.chunks < 1)
      add("shape: stages=", s_.stages, " micro=", s_.micro_batches, " chunks=", s_.chunks, " must all be >= 1");
    else if (static_cast<int>(s_.actions.size()) != s_.stages)
      add("shape: ", s_.actions.size(), " action lists for ", s_.stages, " stages");
  }

  // Every stage runs an F and a backward for each (micro-batch, chunk): a stage listing
  // fewer compute actions than micro x chunks cannot be valid. Checked before the index,
  // whose size is micro x chunks per stage, so that a header promising 2^20 micro-batches
  // over an empty list costs nothing.
  void check_counts() {
    const std::size_t needed = static_cast<std::size_t>(s_.micro_batches) * static_cast<std::size_t>(s_.chunks);
    for (int st = 0; st < s_.stages; ++st) {
      const auto& list = s_.actions[st];
      const auto computes = static_cast<std::size_t>(
          std::count_if(list.begin(), list.end(), [](const Action& a) { return is_compute(a.kind); }));
      if (computes < needed) {
        add("stage ", st, ": ", computes, " compute actions for ", s_.micro_batches, " micro-batches x ", s_.chunks,
            " chunks: each needs an F and a backward (B and W, or BW)");
      }
    }
  }

  void index_stage(int st) {
    auto& idx = index_[st];
    int opt_count = 0;
    const auto& list = s_.actions[st];
    for (int i = 0; i < static_cast<int>(list.size()); ++i) {
      const Action& a = list[i];
      if (a.kind == ActionKind::optimizer_step) {
        ++opt_count;
        opt_pos_.resize(s_.stages, -1);
        opt_pos_[st] = i;
        continue;
      }
      if (a.micro < 0 || a.micro >= s_.micro_batches || a.chunk < 0 || a.chunk >= s_.chunks) {
        add("stage ", st, ": ", format_action(a), " (action ", i, ") is outside micro-batches 0..",
            s_.micro_batches - 1, " / chunks 0..", s_.chunks - 1);
        continue;
      }
      if (is_comm(a.kind) && (a.peer < 0 || a.peer >= s_.stages || a.peer == st)) {
        add("stage ", st, ": ", format_action(a), " names peer ", a.peer, ", which is not another stage");
        continue;
      }
      int& slot = idx.of(a.kind)[idx.at(a.micro, a.chunk)];
      if (slot >= 0)
        add("stage ", st, ": ", format_action(a), " appears twice (actions ", slot, " and ", i, ")");
      else
        slot = i;
    }
    if (opt_count != 1) add("stage ", st, ": ", opt_count, " optimizer steps (OPT); exactly one is needed");
  }

  void check_stage(int st) {
    const auto& idx = index_[st];
    const int last_vs = s_.virtual_stages() - 1;
    int last_compute = -1;
    for (int mb = 0; mb < s_.micro_batches; ++mb) {
      for (int c = 0; c < s_.chunks; ++c) {
        const std::size_t k = idx.at(mb, c);
        const std::string name = format_action({ActionKind::forward, mb, c, -1}).substr(1);  // "3" or "3:1"
        const int f = idx.f[k], b = idx.b[k], w = idx.w[k], bw = idx.bw[k];
        last_compute = std::max({last_compute, f, b, w, bw});
        if (f < 0) add("stage ", st, ": F", name, " is missing");
        const bool split = b >= 0 || w >= 0;
        if (split && bw >= 0)
          add("stage ", st, ": micro-batch ", name, " has both BW and B/W");
        else if (split && (b < 0 || w < 0))
          add("stage ", st, ": micro-batch ", name, " has ", b < 0 ? "W" : "B", " without ", b < 0 ? "B" : "W");
        else if (!split && bw < 0)
          add("stage ", st, ": micro-batch ", name, " has no backward (B and W, or BW)");
        const int back = split ? b : bw;
        if (f >= 0 && back >= 0 && back < f) add("stage ", st, ": backward of ", name, " comes before its F");
        if (b >= 0 && w >= 0 && w < b) add("stage ", st, ": W", name, " comes before B", name);
        check_links(st, mb, c, name, f, back, last_vs);
      }
    }
    const int opt = st < static_cast<int>(opt_pos_.size()) ? opt_pos_[st] : -1;
    if (opt >= 0 && opt < last_compute)
      add("stage ", st, ": OPT (action ", opt, ") comes before compute action ", last_compute,
          "; it must follow every F, B, W and BW");
  }

  // The dependencies of (mb, c) on its neighbouring virtual stages: local ones by order,
  // remote ones through a send/receive pair with matching peers.
  void check_links(int st, int mb, int c, const std::string& name, int f, int back, int last_vs) {
    const auto& idx = index_[st];
    const std::size_t k = idx.at(mb, c);
    const int vs = s_.virtual_stage(st, c);
    // Input activation from vs-1, output gradient from vs+1.
    for (int dir : {-1, +1}) {
      const int nvs = vs + dir;
      const bool exists = nvs >= 0 && nvs <= last_vs;
      const int nst = exists ? s_.stage_of(nvs) : -1;
      const bool remote = exists && nst != st;
      const int consumer = dir < 0 ? f : back;  // needs the neighbour's output
      const int recv = dir < 0 ? idx.ra[k] : idx.rg[k];
      const int send = dir < 0 ? idx.sg[k] : idx.sa[k];  // our output to that neighbour
      const int producer = dir < 0 ? back : f;
      const char* recv_tok = dir < 0 ? "RA" : "RG";
      const char* send_tok = dir < 0 ? "SG" : "SA";
      if (!remote) {
        if (recv >= 0) add("stage ", st, ": ", recv_tok, name, " receives from no remote stage");
        if (send >= 0) add("stage ", st, ": ", send_tok, name, " sends to no remote stage");
        if (exists && consumer >= 0) {
          // Same-stage neighbour (one stage, several chunks): its action must come first.
          const auto& nidx = index_[nst];
          const std::size_t nk = nidx.at(mb, s_.chunk_of(nvs));
          const int dep = dir < 0 ? nidx.f[nk] : std::max(nidx.b[nk], nidx.bw[nk]);
          if (dep >= 0 && dep > consumer)
            add("stage ", st, ": micro-batch ", name, " uses chunk ", s_.chunk_of(nvs), "'s result before it is made");
        }
        continue;
      }
      const auto& a_recv = recv >= 0 ? s_.actions[st][recv] : Action{};
      if (recv < 0)
        add("stage ", st, ": ", dir < 0 ? "F" : "backward ", name, " has no ", recv_tok, name, "<", nst, " before it");
      else if (a_recv.peer != nst)
        add("stage ", st, ": ", format_action(a_recv), " should receive from stage ", nst);
      else if (consumer >= 0 && recv > consumer)
        add("stage ", st, ": ", format_action(a_recv), " comes after the action that needs it");
      if (send < 0)
        add("stage ", st, ": ", dir < 0 ? "backward " : "F", name, " has no ", send_tok, name, ">", nst, " after it");
      else if (s_.actions[st][send].peer != nst)
        add("stage ", st, ": ", format_action(s_.actions[st][send]), " should send to stage ", nst);
      else if (producer >= 0 && send < producer)
        add("stage ", st, ": ", format_action(s_.actions[st][send]), " comes before the action it sends the result of");
    }
  }

  const Schedule& s_;
  ValidationReport report_;
  std::vector<StageIndex> index_;
  std::vector<int> opt_pos_;
};

}  // namespace

std::string ValidationReport::summary() const {
  std::ostringstream os;
  for (const auto& e : errors) os << e << "\n";
  return os.str();
}

ValidationReport validate(const Schedule& s) { return Checker(s).run(); }

void check_valid(const Schedule& s) {
  const ValidationReport r = validate(s);
  if (r.ok()) return;
  std::string first;
  for (std::size_t i = 0; i < r.errors.size() && i < 3; ++i) first += (i ? "; " : "") + r.errors[i];
  STRATA_THROW(Errc::invalid_argument, "schedule '", s.kind, "' is not valid (", r.errors.size(),
               r.errors.size() >= kMaxErrors ? "+" : "", " problems): ", first);
}

}  // namespace strata::pipeline
