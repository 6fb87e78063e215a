// HostLane: the host layers an overlapped optimizer step updates during backward (the lane's
// half for optimizer state in host RAM; overlapped_step.h has the protocol of the whole).
//
// Protocol. plan(state_on_nvme) picks this step's host layers in backward order: those whose
// state lives in host RAM, when overlaps_host_state() allows (else they step after backward),
// and whose spare arrays (OptimizerState::spare) the host memory gives; a layer refused steps
// after backward for the rest of the run, said once. step() runs on the lane: each layer, once
// `ready(li)` has returned (its gradient is in, the bet holds), is stepped out of place from
// its state into its spare arrays, its compute copies going where the synchronous step sends
// them. keep() makes every planned layer's spare arrays its state and marks it kept, which the
// synchronous step then skips (kept()); clear_kept() before each settle.
#pragma once

#include <functional>
#include <vector>

#include "engine/config.h"
#include "engine/layout.h"
#include "engine/optimizer_state.h"
#include "engine/shard_update.h"
#include "optim/step_args.h"
#include "runtime/core/trace.h"

namespace strata::engine {

class HostLane {
 public:
  struct Context {  // what the host lane reads and updates and does not own
    const EngineConfig& cfg;
    const Layout& layout;
    int rank = 0;
    OptimizerState& state;
    ShardUpdate& update;
    Tracer* tracer = nullptr;  // the host optimizer's spans, or null
  };

  explicit HostLane(const Context& ctx) : c_(ctx) {}
  HostLane(const HostLane&) = delete;
  HostLane& operator=(const HostLane&) = delete;

  void plan(bool state_on_nvme);
  bool empty() const noexcept { return order_.empty(); }
  void step(const optim::StepArgs& a, float lr, const std::function<void(int li)>& ready);  // on the lane
  void keep();
  void clear_kept() { kept_.assign(c_.layout.layers().size(), 0); }
  const std::vector<char>& kept() const noexcept { return kept_; }  // per layer

 private:
  Context c_;
  std::vector<int> order_;      // the host layers the lane steps, backward order
  std::vector<char> kept_;      // per layer: keep() made the lane's update its state
  std::vector<char> no_spare_;  // per layer: its spare arrays did not fit; it steps after backward
};

}  // namespace strata::engine
