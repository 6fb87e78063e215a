// The Engine facade (the protocol is in engine.h): checks each call against the protocol and
// delegates to the engine's parts: PlacementPlan (placement_plan.h: where state goes),
// ParamHomes (param_homes.h: resident parameters and shards), OptimizerState
// (optimizer_state.h), GradReducer (grad_reducer.h: gradient buffers, reduction,
// accumulators), GatherPath (gather_path.h: stage-3 gathers), UpdateStaging
// (update_staging.h: updated copies to their tier), NvmeHomes (nvme_homes.h: the parameter
// store and the directory locks), StepScalars (step_scalars.h: norm, scaling, clipping,
// counters), ShardUpdate (shard_update.h: the update on every tier), OverlappedStep
// (overlapped_step.h: the lane and its tail) and OptimizerStep (optimizer_step.h: the step over
// those three); setup.cc builds them in order, impl.cc holds the shared helpers.
#include "engine/engine.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <nlohmann/json.hpp>

#include "engine/detail/engine_impl.h"
#include "runtime/comm/communicator.h"
#include "runtime/core/error.h"
#include "runtime/core/log.h"
#include "runtime/core/units.h"

namespace strata::engine {

Engine::Engine(const EngineOptions& options) {
  STRATA_CHECK(options.device != nullptr, Errc::invalid_argument, "EngineOptions.device is required");
  impl_ = std::make_unique<Impl>(options);
}

Engine::~Engine() {
  if (!impl_ || !impl_->setup_done()) return;
  auto& I = *impl_;
  if (I.step.overlap) I.step.overlap->cancel();  // its thread uses every part reset below
  I.checkpoints.loads.reset();
  I.checkpoints.saves.reset();  // joins a pending save's writer and frees its staging
  // Every stream drains before what its work touches (stores, buffers) goes away, whatever
  // another one failed with.
  if (I.gather_path) {
    try {
      I.gather_path->synchronize();
    } catch (const std::exception& e) {
      STRATA_LOG(warn, "rank ", I.ranks.rank, ": engine shutdown: ", e.what());
    }
  }
  I.settle({I.dev_stream.get()}, "engine shutdown");
  if (!I.ledger) return;  // setup() failed before allocating anything
  I.gather_path.reset();  // frees the gathered layers and their staging
  I.grads.reset();        // waits for its reductions, frees its buffers and accumulators
  I.updates.reset();      // waits for its copies, frees the staging
  I.opt_state.reset();    // frees the resident optimizer state, closes the swap files, releases their charges
  I.homes.reset();        // frees the resident parameters and shards
  I.offloaded.reset();    // an offload_states() spill store lives in the NVMe tier
  I.nvme.reset();         // drains the parameter store's I/O, closes it, releases its charges and the locks
}

int Engine::register_param(const std::string& name, std::vector<std::int64_t> shape, int layer, ParamInit init,
                           float lr_scale) {
  STRATA_CHECK(!impl_->setup_done(), Errc::invalid_argument, "register_param('", name, "') after setup()");
  STRATA_CHECK(std::isfinite(lr_scale) && lr_scale > 0.0f, Errc::invalid_argument, "register_param('", name,
               "'): lr_scale ", lr_scale, " must be finite and above 0");
  // A q8 block of moments is stepped whole, at one learning rate; tensors with their own
  // rate may meet inside a block.
  STRATA_CHECK(lr_scale == 1.0f || impl_->cfg.optimizer.moment_format != MomentFormat::q8, Errc::invalid_argument,
               "register_param('", name, "'): lr_scale ", lr_scale,
               " with q8 moments (optimizer.moments \"q8\"): a q8 block of 16 moments takes one learning rate; use "
               "bf16 or fp32 moments with per-tensor learning rates (unit scaling)");
  ParamSpec p;
  p.name = name;
  p.shape = std::move(shape);
  p.layer = layer;
  p.init = init;
  p.lr_scale = lr_scale;
  impl_->declared.params.push_back(std::move(p));
  return static_cast<int>(impl_->declared.params.size()) - 1;
}

void Engine::freeze_layer(int layer) {
  STRATA_CHECK(!impl_->setup_done(), Errc::invalid_argument, "freeze_layer(", layer, ") after setup()");
  impl_->declared.frozen.push_back(layer);
}

void Engine::begin_step() {
  auto& I = *impl_;
  I.require_complete_setup("begin_step");
  STRATA_CHECK(!I.flags.in_step, Errc::invalid_argument, "begin_step() twice without step()");
  STRATA_CHECK(!I.flags.in_eval, Errc::invalid_argument, "begin_step() inside begin_eval()/end_eval()");
  STRATA_CHECK(!I.checkpoints.loads->state_mixed(), Errc::invalid_argument,
               "begin_step() after a checkpoint load failed while writing the state (its error said why): the "
               "state is partly loaded; load a checkpoint again before training");
  I.write_pending_values();
  if (I.flags.grads_stale) {
    I.step.overlap->finish_tail();
    I.grads->zero();
    I.flags.grads_stale = false;
  }
  I.flags.in_step = true;
  I.traffic.io = {};
  I.traffic.step_start = std::chrono::steady_clock::now();
  I.grads->begin_step();
  if (I.gather_path) I.gather_path->begin_step();
  I.step.run->begin(!I.plan->replan_pending());
}

void Engine::begin_eval() {
  auto& I = *impl_;
  I.require_complete_setup("begin_eval");
  STRATA_CHECK(!I.flags.in_step && !I.flags.in_eval, Errc::invalid_argument,
               "begin_eval() inside a step or another evaluation");
  STRATA_CHECK(!I.checkpoints.loads->state_mixed(), Errc::invalid_argument,
               "begin_eval() after a checkpoint load failed while writing the state: the state is partly loaded; "
               "load a checkpoint again first");
  I.write_pending_values();
  I.flags.in_eval = true;
}

void Engine::end_eval() {
  auto& I = *impl_;
  STRATA_CHECK(I.flags.in_eval, Errc::invalid_argument, "end_eval() without begin_eval()");
  for (std::size_t li = 0; li < I.layer_count() && I.gather_path; ++li) {
    STRATA_CHECK(I.gather_path->in_use(static_cast<int>(li)) == 0, Errc::invalid_argument,
                 "end_eval() with a layer still gathered: release every gather first");
  }
  I.flags.in_eval = false;
}

std::vector<TensorView> Engine::gather(int layer) {
  auto& I = *impl_;
  I.require_setup("gather");
  const int li = I.layout->layer_index(layer);
  STRATA_CHECK(I.flags.in_step || I.flags.in_eval, Errc::invalid_argument, "gather(", layer,
               ") outside begin_step()/step() and begin_eval()/end_eval()");
  I.step.overlap->before_layer(li);  // the last step's tail has stepped it
  // Stage 3 gathers the layer, except a persistent one; stages 0-2 hold every layer.
  void* gathered = I.gather_path ? I.gather_path->gather(li, I.flags.in_eval, I.step_calls() + 1) : nullptr;
  return I.views(li, gathered != nullptr ? gathered : I.homes->full(li), I.cdt());
}
void Engine::release(int layer) {
  auto& I = *impl_;
  I.require_setup("release");
  const int li = I.layout->layer_index(layer);
  if (I.gather_path) I.gather_path->release(li, I.flags.in_eval);
}
std::vector<TensorView> Engine::grad_buffers(int layer) {
  auto& I = *impl_;
  I.require_setup("grad_buffers");
  const int li = I.layout->layer_index(layer);
  STRATA_CHECK(I.flags.in_step, Errc::invalid_argument, "grad_buffers(", layer, ") outside begin_step()/step()");
  STRATA_CHECK(!I.frozen(li), Errc::invalid_argument, "grad_buffers(", layer, "): layer ", layer,
               " is frozen (freeze_layer) and takes no gradient: gather and release it in backward only");
  I.step.overlap->before_layer(li);  // the last step's tail is done with its accumulator
  return I.views(li, I.grads->buffer(li, [&I] { return I.gather_path && I.gather_path->drop_retained(); }), I.cdt());
}

StepResult Engine::step() {
  auto& I = *impl_;
  I.require_setup("step");
  STRATA_CHECK(I.flags.in_step, Errc::invalid_argument, "step() without begin_step()");
  I.check_step_ready();
  I.grads->sync();  // every reduction of the step is in
  I.dev_stream->synchronize();
  Tracer::Span span(I.options.tracer, "optimizer", "step");
  I.replan_on_first_trace();
  StepResult result;
  try {
    result = I.step.run->run();
    if (!result.skipped) I.homes->refresh();  // replicas (stages 1-2) and persistent layers from the new shards
  } catch (...) {
    // The step is over (OptimizerStep rolled back what it could) and its gradients are dropped.
    I.flags.in_step = false;
    I.flags.grads_stale = true;
    throw;
  }
  I.step.overlap->zero_grads();
  I.flags.in_step = false;
  I.traffic.io.step_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - I.traffic.step_start).count();
  I.traffic.last = I.traffic.io;
  I.checkpoints.saves->poll(false);  // an asynchronous checkpoint commits once every rank's writes landed
  return result;
}

void Engine::abandon_step() {
  auto& I = *impl_;
  if (!I.flags.setup_complete || (!I.flags.in_step && !I.flags.in_eval)) return;
  const bool step = I.flags.in_step;
  I.flags.in_step = I.flags.in_eval = false;  // whatever fails below, the next begin_step() is allowed
  std::exception_ptr failed;
  const auto attempt = [&failed](const auto& f) {
    try {
      f();
    } catch (...) {
      if (!failed) failed = std::current_exception();
    }
  };
  if (step) {
    I.step.overlap->cancel();            // the lane's updates undone; a last step's tail finished
    attempt([&I] { I.grads->sync(); });  // queued reductions still read their buffers
    I.grads->drop_buffers();
    I.flags.grads_stale = true;  // begin_step() zeroes the accumulators
  }
  if (I.gather_path) attempt([&I] { I.gather_path->abandon(); });
  if (failed) std::rethrow_exception(failed);
}

void Engine::reduce_grads(int layer) {
  auto& I = *impl_;
  I.require_complete_setup("reduce_grads");
  const int li = I.layout->layer_index(layer);
  STRATA_CHECK(!I.frozen(li), Errc::invalid_argument, "reduce_grads(", layer, "): layer ", layer,
               " is frozen (freeze_layer) and takes no gradient");
  I.step.overlap->before_layer(li);
  I.grads->reduce(li, I.traffic.io);
  // The layer's last reduction of the step: an overlapped optimizer may take it from here.
  const auto accum = std::max<std::int64_t>(1, I.cfg.gradient_accumulation_steps);
  if (I.step.overlap->active() && I.grads->reductions(li) == accum)
    I.step.overlap->layer_done(li, I.grads->completion());
}

float Engine::loss_scale() const noexcept {
  const auto& I = *impl_;
  return static_cast<float>(I.step.scalars ? I.step.scalars->loss_scale() : I.initial_loss_scale());
}
DType Engine::compute_dtype() const noexcept { return impl_->cdt(); }
int Engine::rank() const noexcept { return impl_->ranks.rank; }
int Engine::world_size() const noexcept { return impl_->ranks.world; }
int Engine::pipeline_stages() const noexcept {
  return impl_->options.pipeline_comm != nullptr ? impl_->options.pipeline_comm->world_size() : 1;
}
const EngineConfig& Engine::config() const noexcept { return impl_->cfg; }
device::Device& Engine::device() const noexcept { return impl_->dev; }
const Layout& Engine::layout() const {
  impl_->require_setup("layout");
  return *impl_->layout;
}

std::vector<int> Engine::layer_ids() const {
  std::vector<int> ids;
  for (const auto& L : layout().layers()) ids.push_back(L.id);
  return ids;
}

MemoryReport Engine::memory() const {
  MemoryReport r;
  if (!impl_->setup_done()) return r;
  r.device = impl_->ledger->usage(Tier::device);
  r.host = impl_->ledger->usage(Tier::host);
  r.nvme = impl_->ledger->usage(Tier::nvme);
  r.device_memory_peak = impl_->dev.memory_stats().peak_bytes;
  r.parameters = impl_->layout->total_numel();
  if (const auto& g = impl_->gather_path) {
    r.live_gathered_elems = g->live_elems();
    r.peak_gathered_elems = g->peak_live_elems();
  }
  return r;
}

IoStats Engine::io_stats() const { return impl_->traffic.last; }

void Engine::synchronize() {
  auto& I = *impl_;
  if (!I.setup_done()) return;
  I.finish_tail();
  if (I.grads) I.grads->sync();
  if (I.gather_path) I.gather_path->synchronize();
  if (I.updates) I.updates->synchronize();
  if (I.dev_stream) I.dev_stream->synchronize();
  I.drain_io();
}

std::string Engine::explain_placement() const {
  impl_->require_setup("explain_placement");
  return impl_->plan ? impl_->plan->explain() : std::string();
}

std::vector<float> Engine::full_parameters() {
  auto& I = *impl_;
  I.require_complete_setup("full_parameters");
  I.write_pending_values();
  I.finish_tail();
  const Layout& lay = *I.layout;
  std::vector<std::vector<float>> per_layer(lay.layers().size());
  for (std::size_t li = 0; li < lay.layers().size(); ++li) per_layer[li] = I.layer_values(li);
  std::vector<float> out;
  out.reserve(lay.total_numel());
  for (const auto& p : lay.params()) {
    const int li = lay.layer_index(p.layer);
    const float* src = per_layer[li].data() + p.offset;
    out.insert(out.end(), src, src + p.numel);
  }
  return out;
}

std::vector<float> Engine::layer_parameters(int layer) {
  auto& I = *impl_;
  I.require_complete_setup("layer_parameters");
  I.write_pending_values();
  I.finish_tail();
  const int li = I.layout->layer_index(layer);
  const auto& L = I.layout->layers()[static_cast<std::size_t>(li)];
  auto values = I.layer_values(static_cast<std::size_t>(li));
  values.resize(L.numel);  // its parameters lie first, in registration order; the padding goes
  return values;
}

// Checkpoints (checkpoint_save.h, checkpoint_load.h): the contract's checks here; the
// engine's queued work lands (and a save, load or weight write after training began waits
// for a pending save) before a part reads or writes the state.
SaveResult Engine::save_checkpoint(const std::string& root, const std::string& trainer_state, const SaveOptions& opts) {
  auto& I = *impl_;
  I.require_complete_setup("save_checkpoint");
  STRATA_CHECK(!I.flags.in_step && !I.flags.in_eval, Errc::invalid_argument,
               "save_checkpoint() inside a step or an evaluation: call it after step() or end_eval()");
  bool object = false;
  try {
    object = nlohmann::json::parse(trainer_state).is_object();
  } catch (const nlohmann::json::exception&) {
  }
  STRATA_CHECK(object, Errc::invalid_argument, "save_checkpoint: trainer_state must be a JSON object, got '",
               trainer_state.substr(0, 80), "'");
  STRATA_CHECK(!I.checkpoints.loads->state_mixed(), Errc::invalid_argument,
               "save_checkpoint() after a checkpoint load ",
               "failed while writing the state: the state is partly loaded and must not become a checkpoint; load "
               "one first");
  I.write_pending_values();
  synchronize();  // parameter write-backs and reductions have landed
  return I.checkpoints.saves->save(root, trainer_state, opts);
}

std::vector<SaveResult> Engine::finished_checkpoints() {
  return impl_->checkpoints.saves ? impl_->checkpoints.saves->finished() : std::vector<SaveResult>{};
}

void Engine::wait_checkpoint() {
  impl_->require_setup("wait_checkpoint");
  if (impl_->checkpoints.saves) impl_->checkpoints.saves->poll(true);
}

std::string Engine::load_checkpoint(const std::string& path) {
  auto& I = *impl_;
  I.require_complete_setup("load_checkpoint");  // a load writes every value: pending initial ones are not needed
  STRATA_CHECK(!I.flags.in_step && !I.flags.in_eval, Errc::invalid_argument,
               "load_checkpoint() inside a step or an evaluation: call it between steps");
  synchronize();
  I.checkpoints.saves->poll(true);
  I.drop_gathered();
  std::string trainer_state = I.checkpoints.loads->load(path);
  I.flags.first_values_pending = false;
  return trainer_state;
}

void Engine::init_weights(const WeightReader& read) {
  auto& I = *impl_;
  I.require_complete_setup("init_weights");  // writes every value: pending initial ones are never drawn
  STRATA_CHECK(I.step_calls() == 0 && !I.flags.in_step && !I.flags.in_eval, Errc::invalid_argument,
               "init_weights() after training began: call it right after setup()");
  synchronize();
  I.drop_gathered();
  I.checkpoints.loads->init_weights(read);
  I.flags.first_values_pending = false;
}

void Engine::write_weights(const WeightReader& read, int source_rank) {
  auto& I = *impl_;
  I.require_complete_setup("write_weights");
  STRATA_CHECK(!I.flags.in_step && !I.flags.in_eval, Errc::invalid_argument,
               "write_weights() inside a step or an evaluation: call it between steps");
  STRATA_CHECK(source_rank >= -1 && source_rank < I.ranks.world, Errc::invalid_argument, "write_weights: source rank ",
               source_rank, " is not one of the ", I.ranks.world, " ranks");
  I.write_pending_values();  // the moments it keeps
  synchronize();
  I.checkpoints.saves->poll(true);  // a pending asynchronous checkpoint holds the values before the write
  I.drop_gathered();
  I.checkpoints.loads->write_weights(read, source_rank);
}

}  // namespace strata::engine
