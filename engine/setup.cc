// Engine::setup (the protocol in engine.h): checks that every rank registered the same model,
// lays it out, places every layer's state on its tiers (placement_plan.h) and allocates it
// and the buffers and streams the step needs. The initial values (fp32 masters and zeroed
// moments where the optimizer state lives, compute-dtype parameters where they live,
// replicated at stages 0-2 and sharded at stage 3) are written by write_first_values() when
// the first call needs them; init_weights() and load_checkpoint() write their own instead.
#include <cstring>

#include "engine/detail/engine_impl.h"
#include "engine/engine.h"
#include "runtime/comm/communicator.h"
#include "runtime/core/error.h"
#include "runtime/core/log.h"
#include "runtime/core/progress.h"
#include "runtime/core/units.h"
#include "runtime/device/arena.h"

namespace strata::engine {

void Engine::Impl::check_same_model() const {
  const Layout& lay = *layout;
  // Every rank must have registered the same model: compare fingerprints.
  if (ranks.comm != nullptr && ranks.world > 1) {
    std::uint64_t mine = lay.fingerprint();
    std::vector<std::uint64_t> all(ranks.world);
    ranks.comm->all_gather(&mine, all.data(), 2, DType::fp32);  // 8 bytes carried as two fp32 words
    for (int r = 0; r < ranks.world; ++r) {
      STRATA_CHECK(
          all[r] == all[0], Errc::invalid_argument, "rank ", ranks.rank,
          ": the registered parameters differ between ranks (rank ", r,
          " registered a different model than "
          "rank 0: names, shapes, layers or init). Every rank must register the same parameters in the same order");
    }
  }
}

void Engine::Impl::allocate_step_buffers() {
  const ShardMap& shards = plan->shards();
  grads = std::make_unique<GradReducer>(GradReducer::Context{.layout = *layout,
                                                             .stage = cfg.zero.stage,
                                                             .overlap_comm = cfg.zero.overlap_comm,
                                                             .dev = dev,
                                                             .dev_stream = *dev_stream,
                                                             .comm = ranks.comm,
                                                             .dcomm = ranks.dcomm,
                                                             .rank = ranks.rank,
                                                             .world = ranks.world,
                                                             .cdt = cdt(),
                                                             .ledger = *ledger,
                                                             .shards = shards,
                                                             .tracer = options.tracer,
                                                             .accumulation = cfg.gradient_accumulation_steps});
  nvme = std::make_unique<NvmeHomes>(NvmeHomes::Context{.cfg = cfg,
                                                        .layout = *layout,
                                                        .rank = ranks.rank,
                                                        .cbytes = cbytes(),
                                                        .dev = dev,
                                                        .ledger = *ledger,
                                                        .tracer = options.tracer});
  // The stores size their buffers to what the host budget leaves once everything allocated
  // after them is set aside (the parameter store's one buffer too, for the swapper).
  const PlacementPlan::HostParts host = plan->host_parts();
  opt_state = std::make_unique<OptimizerState>(OptimizerState::Context{.cfg = cfg,
                                                                       .layout = *layout,
                                                                       .dev_stream = *dev_stream,
                                                                       .ledger = *ledger,
                                                                       .nvme = *nvme,
                                                                       .shards = shards,
                                                                       .tracer = options.tracer,
                                                                       .rank = ranks.rank});
  if (shards.any_opt_on(Tier::nvme)) opt_state->open_swapper(host.after_stores() + host.param_min);
  // Muon's step gathers and orthogonalizes in host RAM (muon_update.cc, muon_swapped.cc): charged once, for the run.
  if (host.muon)
    ledger->charge(
        Tier::host, Kind::buffers, host.muon,
        "Muon's gathers and orthogonalized updates (the layers on NVMe hold theirs from the scan to the step)");
  if (shards.any_params_on(Tier::nvme)) nvme->open_params(shards.param_tiers(), host.after_stores());
  homes = std::make_unique<ParamHomes>(ParamHomes::Context{.layout = *layout,
                                                           .stage = cfg.zero.stage,
                                                           .rank = ranks.rank,
                                                           .world = ranks.world,
                                                           .cdt = cdt(),
                                                           .dev_stream = *dev_stream,
                                                           .ledger = *ledger,
                                                           .nvme = *nvme,
                                                           .shards = shards,
                                                           .comm = ranks.comm,
                                                           .dcomm = ranks.dcomm,
                                                           .io = traffic.io});
  updates = std::make_unique<UpdateStaging>(
      UpdateStaging::Context{.layout = *layout,
                             .stage = cfg.zero.stage,
                             .rank = ranks.rank,
                             .cdt = cdt(),
                             .dev = dev,
                             .dev_stream = *dev_stream,
                             .ledger = *ledger,
                             .nvme = *nvme,
                             .io = traffic.io,
                             .tracer = options.tracer,
                             .shards = shards,
                             .copies = [this](int li) {
                               return UpdateStaging::Copies{homes->full(li), homes->shard(li)};
                             }});
}

void Engine::Impl::make_gather_path() {
  const GatherPath::Context gc{.layout = *layout,
                               .zero = cfg.zero,
                               .rank = ranks.rank,
                               .world = ranks.world,
                               .cdt = cdt(),
                               .dev = dev,
                               .ledger = *ledger,
                               .comm = ranks.comm,
                               .dcomm = ranks.dcomm,
                               .tracer = options.tracer,
                               .io = traffic.io,
                               .nvme = *nvme,
                               .shards = plan->shards(),
                               .shard_data = [this](int li) -> const void* { return homes->shard(li); },
                               // Room for backward's gradient buffers (the current one, and the one a running
                               // reduction still holds): a prefetch that a gradient buffer then evicts is read twice.
                               .reserve =
                                   [this] {
                                     return device::Arena::round_up(layout->largest_layer_padded() * cbytes()) *
                                            (grads->overlapped() ? 2 : 1);
                                   },
                               // A prefetch reads the layer's shards once the last step's tail has stepped it.
                               .before_read =
                                   [this](int li) {
                                     if (step.overlap != nullptr) step.overlap->before_layer(li);
                                   }};
  gather_path = std::make_unique<GatherPath>(gc);
}

void Engine::Impl::make_stepper() {
  step.scalars = std::make_unique<StepScalars>(StepScalars::Context{.cfg = cfg,
                                                                    .layout = *layout,
                                                                    .world = ranks.world,
                                                                    .cdt = cdt(),
                                                                    .comm = ranks.comm,
                                                                    .pipeline = options.pipeline_comm,
                                                                    .grads = *grads},
                                               scaler_config());
  step.update = std::make_unique<ShardUpdate>(ShardUpdate::Context{.cfg = cfg,
                                                                   .layout = *layout,
                                                                   .rank = ranks.rank,
                                                                   .cdt = cdt(),
                                                                   .dev_stream = *dev_stream,
                                                                   .grads = *grads,
                                                                   .state = *opt_state,
                                                                   .updates = *updates,
                                                                   .tracer = options.tracer,
                                                                   .comm = ranks.comm});
  // What a failed update still has queued finishes before its staging goes.
  auto settle_after_failure = [this] {
    settle({dev_stream.get()}, "device work or a parameter write-back after a failed step");
  };
  step.overlap = std::make_unique<OverlappedStep>(OverlappedStep::Context{.cfg = cfg,
                                                                          .layout = *layout,
                                                                          .rank = ranks.rank,
                                                                          .update = *step.update,
                                                                          .grads = *grads,
                                                                          .state = *opt_state,
                                                                          .io = traffic.io,
                                                                          .settle = settle_after_failure,
                                                                          .tracer = options.tracer});
  step.run = std::make_unique<OptimizerStep>(OptimizerStep::Context{.cfg = cfg,
                                                                    .rank = ranks.rank,
                                                                    .scalars = *step.scalars,
                                                                    .update = *step.update,
                                                                    .overlap = *step.overlap,
                                                                    .io = traffic.io,
                                                                    .settle = settle_after_failure});
}

void Engine::Impl::add_layer(std::size_t li) {
  // A frozen layer has no master, moments or accumulator: its compute-dtype parameters are
  // all it holds.
  if (!layout->layers()[li].frozen) {
    opt_state->add_layer(static_cast<int>(li));
    grads->add_layer(static_cast<int>(li));
  }
  homes->add_layer(static_cast<int>(li));
}

void Engine::Impl::init_layer(std::size_t li, InitScratch& buf) {
  const Layout& lay = *layout;
  const int stage = cfg.zero.stage;
  std::vector<float>& init = buf.init;
  std::vector<float>& master_shard = buf.master_shard;
  const auto& L = lay.layers()[li];

  // Master weights: the whole layer (stage 0) or this rank's shard of every bucket, built
  // in host memory and written to their tier with zeroed moments.
  init.resize(L.padded);
  fill_init(L, 0, L.padded, init.data());
  if (stage != 0) {
    master_shard.resize(L.shard);
    for (std::size_t k = 0; k < L.buckets.size(); ++k) {
      const auto& b = lay.buckets()[L.buckets[k]];
      std::memcpy(master_shard.data() + L.shard_offsets[k], init.data() + bucket_pos(b, L) + own_begin(b), b.shard * 4);
    }
  }
  if (!L.frozen)
    opt_state->write(static_cast<int>(li), stage == 0 ? init.data() : master_shard.data(), nullptr, nullptr);
  homes->write(static_cast<int>(li), init.data(), master_shard.data());
  dev_stream->synchronize();  // the host buffers above are reused for the next layer
}

// The initial values (the registered initialisers, keyed by the seed) into every tier,
// committed. A failure (an NVMe write) discards what the swap files and the parameter store
// took and leaves them pending: the next call that needs them writes them all again, and
// init_weights() or load_checkpoint() may still replace them.
void Engine::Impl::write_first_values() {
  InitScratch buf;
  // Drawing the values and writing them to NVMe take minutes at scale.
  Progress progress("setup: first values into the tiers (fp32)", layout->total_padded() * 4, ranks.rank != 0);
  try {
    for (std::size_t li = 0; li < layout->layers().size(); ++li) {
      init_layer(li, buf);
      progress.advance(layout->layers()[li].padded * 4);
    }
    opt_state->commit_writes();
    homes->commit_writes();
  } catch (...) {
    settle({dev_stream.get()}, "");  // copies queued from the scratch buffers land before they go
    opt_state->discard_writes();
    homes->discard_writes();
    throw;
  }
  flags.first_values_pending = false;
}

void Engine::reserve_for_trainer(std::uint64_t device_bytes, int layers_at_once) {
  auto& I = *impl_;
  STRATA_CHECK(!I.setup_done(), Errc::invalid_argument, "reserve_for_trainer() after setup(): call it before");
  STRATA_CHECK(layers_at_once >= 1, Errc::invalid_argument, "reserve_for_trainer: layers_at_once ", layers_at_once,
               " must be at least 1");
  I.declared.device_reserve = device_bytes;
  I.declared.layers_at_once = layers_at_once;
}

void Engine::setup() {
  auto& I = *impl_;
  STRATA_CHECK(!I.setup_done(), Errc::invalid_argument, "setup() called twice");
  const int stage = I.cfg.zero.stage;
  for (int id : I.declared.frozen) {
    bool any = false;
    for (auto& p : I.declared.params) {
      if (p.layer != id) continue;
      p.frozen = any = true;
    }
    STRATA_CHECK(any, Errc::invalid_argument, "freeze_layer(", id, "): no parameter is registered under layer ", id);
  }
  I.layout = std::make_unique<Layout>(std::move(I.declared.params), I.ranks.world, I.cfg.zero.reduce_bucket_size);
  const Layout& lay = *I.layout;

  I.check_same_model();

  I.ledger = std::make_unique<MemoryLedger>(I.dev, host_budget_of(I.cfg),
                                            I.cfg.offload_optimizer.pin_memory || I.cfg.offload_param.pin_memory,
                                            I.cfg.memory_budget.nvme, I.declared.device_reserve);
  I.dev_stream = I.dev.create_stream();
  // Where every layer's state lives, checked against the device budget (less what the
  // trainer already holds there) and host RAM before anything is allocated.
  const PlacementPlan::Context pc{.cfg = I.cfg,
                                  .layout = lay,
                                  .rank = I.ranks.rank,
                                  .world = I.ranks.world,
                                  .cbytes = I.cbytes(),
                                  .device_budget = I.dev.options().budget_bytes,
                                  .device_in_host_ram = I.dev.backend() == device::Backend::host,
                                  .comm = I.ranks.comm,
                                  .device_collectives = I.device_collectives(),
                                  .device_held_by_others = I.dev.memory_stats().used_bytes + I.declared.device_reserve,
                                  .layers_at_once = I.declared.layers_at_once};
  I.plan = std::make_unique<PlacementPlan>(pc, PlacementPlan::persistent_layers(I.cfg, lay));
  I.plan->place();
  I.plan->check_host_fit();
  I.plan->check_host_budget();
  I.plan->check_nvme_budget();
  const auto& oc = I.cfg.optimizer;
  if (I.dev.backend() == device::Backend::cuda && oc.type != OptimizerType::adam && oc.type != OptimizerType::adamw) {
    for (std::size_t li = 0; li < lay.layers().size(); ++li) {
      STRATA_CHECK(lay.layers()[li].frozen || I.plan->shards().opt_tier(static_cast<int>(li)) != Tier::device,
                   Errc::unsupported, "optimizer.type ", oc.type == OptimizerType::lion ? "Lion" : "Adagrad",
                   " has no CUDA kernel yet, and layer ", lay.layers()[li].id,
                   "'s optimizer state is placed on the GPU: use Adam/AdamW, or run it on the "
                   "CPU with offload_optimizer.device = \"cpu\"");
    }
  }

  I.allocate_step_buffers();

  for (std::size_t li = 0; li < lay.layers().size(); ++li) I.add_layer(li);
  I.flags.first_values_pending = true;  // written by the first call that needs them (write_first_values())
  if (stage == 3) I.make_gather_path();
  I.make_stepper();
  I.checkpoints.saves = std::make_unique<CheckpointSave>(CheckpointSave::Context{.cfg = I.cfg,
                                                                                 .layout = lay,
                                                                                 .ranks = I.ranks,
                                                                                 .cdt = I.cdt(),
                                                                                 .ledger = *I.ledger,
                                                                                 .state = *I.opt_state,
                                                                                 .homes = *I.homes,
                                                                                 .scalars = *I.step.scalars});
  I.checkpoints.loads = std::make_unique<CheckpointLoad>(CheckpointLoad::Context{.cfg = I.cfg,
                                                                                 .layout = lay,
                                                                                 .ranks = I.ranks,
                                                                                 .cdt = I.cdt(),
                                                                                 .state = *I.opt_state,
                                                                                 .homes = *I.homes,
                                                                                 .scalars = *I.step.scalars});
  I.flags.setup_complete = true;
  STRATA_LOG(debug, "rank ", I.ranks.rank, ": ZeRO stage ", stage, ", ", lay.total_numel(), " parameters (",
             lay.total_padded(), " padded) in ", lay.layers().size(), " layers, ", lay.buckets().size(), " buckets");
}

}  // namespace strata::engine
