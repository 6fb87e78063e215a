// HostLane (the protocol in host_lane.h): the overlapped step's host layers, stepped into
// their spare arrays.
#include "engine/host_lane.h"

#include "runtime/core/error.h"
#include "runtime/core/log.h"

namespace strata::engine {

void HostLane::plan(bool state_on_nvme) {
  order_.clear();
  if (!overlaps_host_state(c_.cfg, state_on_nvme)) return;
  no_spare_.resize(c_.layout.layers().size(), 0);
  for (std::size_t i = c_.layout.layers().size(); i-- > 0;) {
    const int li = static_cast<int>(i);
    if (c_.state.tier(li) != Tier::host || no_spare_[i] != 0) continue;
    try {
      (void)c_.state.spare(li);
      order_.push_back(li);
    } catch (const Error& e) {
      no_spare_[i] = 1;
      STRATA_LOG(warn, "rank ", c_.rank, ": layer ", c_.layout.layers()[i].id,
                 "'s optimizer state steps after backward, not during it: its spare copy for the overlapped step "
                 "does not fit (",
                 e.what(), ")");
    }
  }
}

void HostLane::step(const optim::StepArgs& a, float lr, const std::function<void(int li)>& ready) {
  for (int li : order_) {
    ready(li);
    const auto& L = c_.layout.layers()[static_cast<std::size_t>(li)];
    Tracer::Span span(c_.tracer, "optimizer", str_cat("adam layer ", L.id, " host, overlapped"));
    c_.update.out_of_place(a, lr, li);
  }
}

void HostLane::keep() {
  for (int li : order_) {
    c_.state.swap_spare(li);
    kept_[static_cast<std::size_t>(li)] = 1;
  }
}

}  // namespace strata::engine
