// OverlappedStep (the protocol in overlapped_step.h): the lane that steps the NVMe layers
// during backward, the keep-or-undo decision, and the tail that finishes the kept step while
// the next forward runs.
#include <algorithm>
#include <chrono>
#include <exception>
#include <limits>

#include "engine/overlapped_step.h"
#include "runtime/core/error.h"
#include "runtime/core/log.h"
#include "runtime/core/trace.h"

namespace strata::engine {

// The host layers the lane steps, in backward order: those whose state lives in host RAM,
// when overlaps_host_state() allows (else they step in run()), and whose spare arrays the
// host memory gives (a layer refused steps in run(), said once).
void OverlappedStep::plan_host_lane() {
  host_order_.clear();
  if (!overlaps_host_state(c_.cfg, c_.state.has_swapped())) return;
  no_spare_.resize(c_.layout.layers().size(), 0);
  for (std::size_t i = c_.layout.layers().size(); i-- > 0;) {
    const int li = static_cast<int>(i);
    if (c_.state.tier(li) != Tier::host || no_spare_[i] != 0) continue;
    try {
      (void)c_.state.spare(li);
      host_order_.push_back(li);
    } catch (const Error& e) {
      no_spare_[i] = 1;
      STRATA_LOG(warn, "rank ", c_.rank, ": layer ", c_.layout.layers()[i].id,
                 "'s optimizer state steps after backward, not during it: its spare copy for the overlapped step "
                 "does not fit (",
                 e.what(), ")");
    }
  }
}

// The lane steps the swapped layers, or the host layers, in backward order on the plan of a
// step that neither overflows nor clips; run() keeps its work only when the real plan is that
// one. When the last step clipped and this one may end as a tail, the lane bets on nothing:
// it is deferred (start_deferred()).
void OverlappedStep::begin(bool allowed) {
  if (tail_.running()) {  // the last step's tail still runs: this step's lane starts when it ends
    armed_ = allowed ? 1 : 0;
    return;
  }
  const bool swapped = c_.state.has_swapped();
  if (lane_.active()) undo_overlap();  // a step abandoned before run(): never kept
  deferred_ = false;
  if (!allowed || !c_.cfg.offload_optimizer.overlap_step || c_.cfg.optimizer.type == OptimizerType::lamb) return;
  plan_host_lane();
  if (!swapped && host_order_.empty()) return;
  tail_.check();
  // A kept step may finish as a tail (stage 3, every layer's state on NVMe, none persistent:
  // then nothing else in step() touches what the lane updates).
  bool tail_ok = c_.cfg.zero.stage == 3;
  for (std::size_t li = 0; li < c_.layout.layers().size() && tail_ok; ++li)
    tail_ok = c_.state.tier(static_cast<int>(li)) == Tier::nvme && !c_.homes.persistent(static_cast<int>(li));
  tail_ok_ = tail_ok;
  const double max_norm = c_.cfg.gradient_clipping;
  if (tail_ok && swapped && max_norm > 0 && clipped_last_) {
    start_deferred();
    return;
  }
  const optim::StepPlan bet = c_.scalars.bet();
  speculated_scale_ = bet.grad_scale;
  lane_args_ = c_.scalars.args(bet);
  lane_lr_ = c_.scalars.next_lr();
  LanePlan plan;
  for (std::size_t t = c_.state.swapped_layers(); t-- > 0;)
    plan.order.tensors.push_back(t);  // backward: last layer first
  // The bet is lost early when this rank's part of the squared norm already overflows or
  // exceeds the clipping threshold (the global sum can only be larger): the lane stops and
  // the step runs synchronously, without first finishing work it would undo.
  const double scaled_max = max_norm * c_.scalars.loss_scale() * c_.scalars.averaging();
  abandon_above_ = max_norm > 0 ? scaled_max * scaled_max : std::numeric_limits<double>::infinity();
  lane_partial_ = {};
  abandoned_ = false;
  plan.order.defer_commit = true;
  plan.tail = tail_ok;
  launch_lane(plan, true);
}

// A deferred step's lane: the swapper's step starts now, its reads running ahead lowest layer
// first (the order the tail steps in and the next forward gathers in: it needs no gradient
// before the plan), and its first update waits at the lane's plan gate until publish_plan()
// gives it the step's arguments; then it finishes the step as the tail. Bets on nothing, so
// nothing is ever undone.
void OverlappedStep::start_deferred() {
  LanePlan plan;
  for (std::size_t t = 0; t < c_.state.swapped_layers(); ++t) plan.order.tensors.push_back(t);
  plan.order.defer_commit = true;
  plan.deferred = true;
  plan.tail = true;
  deferred_ = true;
  launch_lane(plan, false);
}

// run()'s plan for a deferred lane: its arguments (those the synchronous step would use), then
// the gate. The lane is kept from here on: it finishes the step as the tail. False, publishing
// nothing, when the lane has already ended (it failed reading ahead).
bool OverlappedStep::publish_plan(const optim::StepPlan& plan) {
  lane_args_ = c_.scalars.args(plan);  // the lane reads them only past the gate
  lane_lr_ = c_.scalars.next_lr();
  if (!tail_.keep(nullptr)) return false;
  lane_.open_plan();
  return true;
}

void OverlappedStep::launch_lane(const LanePlan& plan, bool host_layers) {
  tail_.arm(c_.layout.layers().size());
  touched_.assign(c_.layout.layers().size(), 0);
  lane_io_ = {};
  lane_.start(c_.layout.layers().size(), [this, plan, host_layers] {
    std::exception_ptr failed;
    try {
      if (c_.state.has_swapped()) step_swapped_layers(plan);
      if (host_layers) step_host_layers(lane_args_, lane_lr_);
    } catch (...) {
      failed = std::current_exception();
    }
    tail_.lane_ended(failed != nullptr, [this] { c_.state.commit_pending(); });
    if (failed) std::rethrow_exception(failed);
  });
  // The lane reaches the staging only past a gate that this thread opens later (layer_done,
  // or the plan's).
  c_.update.count_into(&lane_io_);
}

// On the lane: the swapper's step, pulled a sub-group at a time. Before a layer's first
// sub-group the lane waits for its gradient and checks the bet (or, deferred, for the plan);
// the reads of that layer and the next run ahead meanwhile. After a layer's last one, the tail
// hears of it; once the tail asks, the layers not yet begun are visited lowest first.
void OverlappedStep::step_swapped_layers(const LanePlan& plan) {
  auto step = c_.state.begin_swapped(plan.order);
  for (;;) {
    if (plan.tail && tail_.ascending()->load(std::memory_order_acquire)) step.ascending_rest();
    const auto next = step.peek();
    if (!next) break;
    const int li = c_.state.swapped_layer(next->tensor);
    if (next->first && plan.deferred) {
      lane_.wait_plan();
    } else if (next->first) {
      lane_.wait_ready(li);
      check_bet(li);
    }
    const offload::SubGroup g = step.take();
    touched_[static_cast<std::size_t>(li)] = 1;
    c_.update.sub_group(lane_args_, lane_lr_, li, g);
    step.put();
    if (next->last && plan.tail) tail_.layer_stepped(li);
  }
  step.finish();
}

// On the lane: the host layers in backward order, each once its gradient is in, stepped out
// of place from its state into its spare arrays; its compute copies go where the synchronous
// step sends them.
void OverlappedStep::step_host_layers(const optim::StepArgs& a, float lr) {
  for (int li : host_order_) {
    lane_.wait_ready(li);
    check_bet(li);
    const auto& L = c_.layout.layers()[static_cast<std::size_t>(li)];
    Tracer::Span span(c_.tracer, "optimizer", str_cat("adam layer ", L.id, " host, overlapped"));
    touched_[static_cast<std::size_t>(li)] = 1;
    c_.update.out_of_place(a, lr, li);
  }
}

void OverlappedStep::layer_done(int li, std::unique_ptr<device::Event> done) {
  if (tail_.running()) finish_tail();  // a layer the next forward never gathered: the tail must end first
  lane_.ready(li, std::move(done));
}

void OverlappedStep::check_bet(int li) {
  if (tail_.kept()) return;  // run() decided: the rest is the tail
  c_.scalars.add_layer_norm(li, lane_partial_);
  if (lane_partial_.finite && lane_partial_.sumsq <= abandon_above_) return;
  abandoned_ = true;
  throw Error(Errc::internal, "overlapped optimizer step abandoned: the gradient overflows or is clipped");
}

void OverlappedStep::before_step() {
  // The last step's tail, when the trainer touched no layer it had left: this step's lane was
  // never started (nothing handed it a layer), so the step runs synchronously.
  armed_ = -1;
  finish_tail();
}

OverlappedStep::Outcome OverlappedStep::settle(const optim::StepPlan& plan) {
  Outcome out;
  out.rolled_back = !finish_overlap(plan);
  out.tail_layers = tail_.running() ? tail_.layers_left() : 0;
  out.deferred = deferred_ && tail_.running() && !out.rolled_back;
  if (out.rolled_back) {
    STRATA_LOG(info, "rank ", c_.rank, ": the overlapped optimizer step was undone (",
               plan.skip ? "gradient overflow" : "gradient clipping", "); the step runs ",
               tail_.running() ? "as the tail, during the next forward" : "synchronously");
  }
  if (!plan.skip) clipped_last_ = plan.clip_coef < 1.0;
  return out;
}

bool OverlappedStep::finish_overlap(const optim::StepPlan& plan) {
  host_kept_.assign(c_.layout.layers().size(), 0);
  if (!lane_.active()) return true;
  if (deferred_) {
    if (!plan.skip && publish_plan(plan)) return true;
    // Skipped (nothing was stepped: the lane stops at its gate, and what it read ahead
    // counts), or the lane failed while it read ahead.
    if (plan.skip) lane_.cancel();
    const std::exception_ptr failed = join_lane();
    undo_overlap();
    if (failed) std::rethrow_exception(failed);
    return true;
  }
  const bool same = !plan.skip && plan.grad_scale == speculated_scale_;  // the same update, bit for bit
  // Kept, and the lane is still at work: it finishes the step as the tail, lowest layer
  // first, while the next forward runs. What it wrote so far commits behind its writes.
  if (same && tail_ok_ && tail_.keep([this] { c_.update.commit(); })) return true;
  const std::exception_ptr failed = join_lane();
  if (failed) {
    undo_overlap();
    if (!abandoned_) std::rethrow_exception(failed);
    redo_as_tail(plan);
    return false;  // a lost bet: the step runs as the tail, or synchronously (it is skipped or clipped)
  }
  if (same) {
    // The host layers' new state becomes theirs; run() steps the layers the lane did not.
    for (int li : host_order_) {
      c_.state.swap_spare(li);
      host_kept_[static_cast<std::size_t>(li)] = 1;
    }
    return true;
  }
  undo_overlap();
  redo_as_tail(plan);
  return false;
}

// A lost bet whose step may end as a tail: the real step runs as one (lowest layer first,
// while the next forward runs) rather than synchronously in run().
void OverlappedStep::redo_as_tail(const optim::StepPlan& plan) {
  if (plan.skip || !tail_ok_ || !c_.state.has_swapped()) return;
  start_deferred();
  if (publish_plan(plan)) return;
  // The fresh lane already failed (reading ahead): its error is the step's.
  const std::exception_ptr failed = join_lane();
  undo_overlap();
  if (failed) std::rethrow_exception(failed);
}

std::exception_ptr OverlappedStep::join_lane() {
  std::exception_ptr failed;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    lane_.join();
  } catch (...) {
    failed = std::current_exception();
  }
  c_.io.optimizer_wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  count_lane_io();
  return failed;
}

void OverlappedStep::count_lane_io() {
  c_.update.count_into(nullptr);
  c_.state.add_swap_traffic(lane_io_);
  c_.io += lane_io_;
  lane_io_ = {};
}

void OverlappedStep::before_layer(int li) {
  if (!tail_.running()) return;
  // Once the lane is over: join it, count its traffic, start the lane begin_step armed.
  if (tail_.wait_for(li)) finish_tail();
}

void OverlappedStep::finish_tail() {
  if (!tail_.stop()) return;
  const std::exception_ptr failed = join_lane();
  touched_.assign(touched_.size(), 0);
  tail_.finish();
  if (failed) {
    armed_ = -1;
    tail_.failed(failed);
  }
  if (armed_ >= 0) {
    const bool allowed = armed_ == 1;
    armed_ = -1;
    begin(allowed);
  }
}

void OverlappedStep::zero_grads() { tail_.zero_grads(); }

// Nothing the lane wrote survives: the swapper's pending generation, the host layers' spare
// arrays and the parameter store's uncommitted writes are dropped, and compute copies it
// rewrote in place are rebuilt from the masters, which are still the last committed ones.
void OverlappedStep::undo_overlap() noexcept {
  lane_.cancel();
  c_.update.count_into(nullptr);
  if (c_.state.has_swapped())
    c_.state.discard_pending();
  else if (std::find(touched_.begin(), touched_.end(), 1) == touched_.end())
    return;  // host layers only, none written yet
  c_.settle();
  c_.update.abort();
  try {
    for (std::size_t li = 0; li < touched_.size(); ++li) {
      if (touched_[li] == 0) continue;
      const int l = static_cast<int>(li);
      if (c_.state.tier(l) != Tier::nvme) {
        c_.homes.write_own(l, 0, c_.state.elems(l), c_.state.resident(l).master);
        continue;
      }
      c_.state.committed_masters(l, [&](std::uint64_t first, const float* master, std::uint64_t n) {
        c_.homes.write_own(l, first, n, master);
      });
    }
  } catch (const std::exception& e) {
    STRATA_LOG(error, "rank ", c_.rank, ": undoing the overlapped optimizer step failed: ", e.what(),
               "; the compute copies may hold the undone update: resume from a checkpoint");
  }
  touched_.assign(touched_.size(), 0);
}

void OverlappedStep::cancel() noexcept {
  armed_ = -1;
  if (tail_.running()) {
    try {
      finish_tail();  // a kept step: let it finish
    } catch (const std::exception& e) {
      STRATA_LOG(error, e.what());
    }
    return;
  }
  if (lane_.active()) undo_overlap();
}

}  // namespace strata::engine
