// One pipeline stage on a ZeRO engine (see stage_runner.h).
#include "train/stage_runner.h"

#include <chrono>
#include <filesystem>

#include "engine/engine.h"
#include "engine/stage_store.h"
#include "pipeline/memory.h"
#include "pipeline/runner.h"
#include "runtime/core/error.h"
#include "runtime/core/units.h"
#include "runtime/device/arena.h"
#include "runtime/device/device.h"

namespace strata::train {

SubdirConfig::SubdirConfig(engine::EngineConfig c, const std::string& sub) : config(std::move(c)) {
  for (std::string* path : {&config.offload_optimizer.nvme_path, &config.offload_param.nvme_path}) {
    if (path->empty()) continue;
    *path += "/" + sub;
    std::filesystem::create_directories(*path);
    made.push_back(*path);  // every replica of the stage tries: the last to leave removes it
  }
}

SubdirConfig::~SubdirConfig() {
  std::error_code ec;
  for (const auto& d : made) std::filesystem::remove(d, ec);  // only if empty
}

void record_actions(Tracer& tracer, const pipeline::StageReport& report) {
  if (!tracer.enabled()) return;
  const auto at = [](double s) {
    return Tracer::Clock::time_point(
        std::chrono::duration_cast<Tracer::Clock::duration>(std::chrono::duration<double>(s)));
  };
  for (const auto& t : report.timings) {
    if (t.action.kind == pipeline::ActionKind::optimizer_step) continue;
    const char* lane = pipeline::is_compute(t.action.kind) ? "compute" : "send/recv";
    tracer.record(lane, pipeline::format_action(t.action), at(t.start), at(t.end));
  }
}

std::unique_ptr<comm::Communicator> sub_comm(const comm::RendezvousConfig& base, const std::string& name, int rank,
                                             int size) {
  if (size == 1) return nullptr;
  comm::CommOptions o;
  o.rendezvous = base;
  o.rendezvous.rank = rank;
  o.rendezvous.world_size = size;
  o.rendezvous.run_id = base.run_id + "-" + name;
  return comm::Communicator::create(o);
}

std::unique_ptr<device::Device> stage_device(const EngineStagesOptions& o) {
  device::DeviceOptions d;
  if (o.device_budget > 0) d.budget_bytes = o.device_budget;
  d.link_gbps = o.link_gbps;
  return device::Device::create(d);
}

struct StageRunner::Impl {
  const pipeline::PipelineModel& model;
  const int stage;
  pipeline::Transport& transport;
  pipeline::ExecutorOptions xo;
  std::unique_ptr<device::Device> dev;
  SubdirConfig cfg;
  engine::Engine engine;
  std::vector<int> ids;
  engine::StageStore store;
  pipeline::StageMemory reserved;                // the first schedule's buffers: what the pool has slots for
  std::uint64_t activations = 0;                 // the current schedule's replayed peak
  std::int64_t steps = 0;                        // run so far
  std::unique_ptr<pipeline::Schedule> schedule;  // the executor keeps a reference
  std::unique_ptr<pipeline::StageExecutor> exec;

  Impl(const pipeline::Schedule& s, const pipeline::PipelineModel& m, const EngineStagesOptions& o, int st,
       comm::Communicator* group, comm::Communicator* pipe, pipeline::Transport& tr, Tracer* tracer)
      : model(m),
        stage(st),
        transport(tr),
        xo(o.executor),
        dev(stage_device(o)),
        cfg(o.config, "stage" + std::to_string(st)),
        engine({.config = cfg.config, .device = dev.get(), .comm = group, .pipeline_comm = pipe, .tracer = tracer}),
        ids(pipeline::stage_layers(s, m, st)),
        store(engine, m, ids, s.stages) {
    reserved = replay(s);
    activations = reserved.peak_bytes;
    store.setup(reserved, static_cast<int>(m.layers.size()) / s.virtual_stages(), st, o.seed, o.init_values);
    xo.shared_device = &store.activation_device();
    xo.scratch_device = store.scratch_device();
    schedule = std::make_unique<pipeline::Schedule>(s);
    exec = std::make_unique<pipeline::StageExecutor>(*schedule, st, m, store, tr, xo);
  }
  pipeline::StageMemory replay(const pipeline::Schedule& s) const {
    return pipeline::stage_memory(s, stage, model, xo.remat, device::Arena::kAlignment, dev->backend());
  }
};

StageRunner::StageRunner(const pipeline::Schedule& schedule, const pipeline::PipelineModel& model,
                         const EngineStagesOptions& o, int stage, comm::Communicator* group, comm::Communicator* pipe,
                         pipeline::Transport& transport, Tracer* tracer)
    : impl_(std::make_unique<Impl>(schedule, model, o, stage, group, pipe, transport, tracer)) {}

StageRunner::~StageRunner() = default;

pipeline::StageReport StageRunner::step() {
  auto report = impl_->exec->run_step();
  ++impl_->steps;
  return report;
}

void StageRunner::reschedule(const pipeline::Schedule& s) {
  Impl& m = *impl_;
  STRATA_CHECK(pipeline::stage_layers(s, m.model, m.stage) == m.ids, Errc::invalid_argument, "pipeline stage ", m.stage,
               ": schedule ", s.kind, " puts other layers on this stage");
  const pipeline::StageMemory need = m.replay(s);
  STRATA_CHECK(need.fits_in(m.reserved), Errc::out_of_budget, "pipeline stage ", m.stage, ": schedule ", s.kind,
               " has more buffers of some size live at once (", format_bytes(need.pool_bytes()),
               " in all) than the pool made at setup holds (", format_bytes(m.reserved.pool_bytes()),
               "); keep its memory limit at the first schedule's");
  m.activations = need.peak_bytes;
  m.xo.first_step = m.steps;
  m.exec.reset();
  m.schedule = std::make_unique<pipeline::Schedule>(s);
  m.exec = std::make_unique<pipeline::StageExecutor>(*m.schedule, m.stage, m.model, m.store, m.transport, m.xo);
}

void StageRunner::start_at(std::int64_t step) {
  Impl& m = *impl_;
  m.steps = step;
  m.xo.first_step = step;
  m.exec.reset();
  m.exec = std::make_unique<pipeline::StageExecutor>(*m.schedule, m.stage, m.model, m.store, m.transport, m.xo);
}

void StageRunner::forward(int micro_batches, const std::function<void(int micro, float* x)>& input,
                          const std::function<void(int micro, const float* y)>& output,
                          const pipeline::PipelineModel* model) {
  Impl& m = *impl_;
  m.engine.begin_eval();
  try {
    m.exec->forward_pass(micro_batches, input, output, model);
  } catch (...) {
    m.engine.end_eval();
    throw;
  }
  m.engine.end_eval();
}

pipeline::Transport& StageRunner::transport() { return impl_->transport; }

std::vector<float> StageRunner::parameters() {
  auto p = impl_->engine.full_parameters();
  impl_->engine.synchronize();
  return p;
}

StageSummary StageRunner::summary() const {
  const Impl& m = *impl_;
  const auto mem = m.engine.memory();
  const auto io = m.engine.io_stats();
  return {static_cast<double>(m.activations),
          static_cast<double>(mem.device.peak_bytes),
          static_cast<double>(mem.host.peak_bytes),
          static_cast<double>(mem.nvme.used_bytes),
          static_cast<double>(io.nvme_read_bytes),
          static_cast<double>(io.nvme_write_bytes),
          m.store.last_step().grad_norm,
          m.store.last_step().clip_coef};
}

const std::vector<int>& StageRunner::layers() const { return impl_->ids; }
engine::Engine& StageRunner::engine() { return impl_->engine; }
const engine::StageStore& StageRunner::store() const { return impl_->store; }

}  // namespace strata::train
