// Engine test support (see engine_support.h).
#include "tests/engine/engine_support.h"

#include <chrono>
#include <cstring>
#include <mutex>

#include "checkpoint/directory.h"
#include "checkpoint/shard_file.h"
#include "runtime/device/device.h"
#include "tests/engine/stack_trainer.h"
#include "tests/support/ranks.h"

namespace strata::test {

std::map<std::string, std::vector<char>> checkpoint_contents(const std::string& path) {
  const auto o = checkpoint::open_checkpoint(path);
  checkpoint::ShardReader r(o.dir, o.manifest);
  std::map<std::string, std::vector<char>> out;
  for (const auto& t : o.manifest.tensors) {
    for (int s = 0; s < (t.has_moments() ? checkpoint::kStates : 1); ++s) {  // a frozen tensor: its values
      const auto state = static_cast<checkpoint::State>(s);
      std::vector<float> v(t.numel);
      r.read_tensor(t, state, 0, t.numel, v.data());
      auto& bytes = out[t.name + "/" + checkpoint::state_name(state)];
      bytes.resize(v.size() * 4);
      std::memcpy(bytes.data(), v.data(), bytes.size());
    }
  }
  return out;
}

std::unique_ptr<device::Device> host_device(std::uint64_t budget_bytes, std::uint64_t pinned_bytes) {
  device::DeviceOptions o;
  o.budget_bytes = budget_bytes;
  o.pinned_budget_bytes = pinned_bytes;
  return device::Device::create(o);
}

engine::EngineConfig mlp_config(int stage, int world, DType compute, int micro, int accum) {
  engine::EngineConfig c;
  c.zero.stage = stage;
  c.train_micro_batch_size_per_gpu = micro;
  c.gradient_accumulation_steps = accum;
  c.train_batch_size = static_cast<std::int64_t>(micro) * accum * world;
  c.bf16 = compute == DType::bf16;
  c.fp16.enabled = compute == DType::fp16;
  c.gradient_clipping = 1.0f;
  c.optimizer.type = engine::OptimizerType::adamw;
  c.optimizer.lr = 1e-3f;
  c.optimizer.weight_decay = 0.01f;
  c.zero.reduce_bucket_size = 300;  // several buckets per layer
  return c;
}

MlpRank::MlpRank(const engine::EngineConfig& c, int hidden) {
  dev = device::Device::create({});
  engine::EngineOptions eo;
  eo.config = c;
  eo.device = dev.get();
  eo.seed = 7;
  engine = std::make_unique<engine::Engine>(eo);
  mlp = std::make_unique<StackTrainer>(*engine, StackConfig{3, hidden, 0.0, 7});
  engine->setup();
}
MlpRank::~MlpRank() = default;
void MlpRank::train(std::int64_t from, std::int64_t to) {
  for (std::int64_t s = from; s < to; ++s) mlp->train_step(s);
}

std::uint64_t kind_bytes(const engine::MemoryReport& m, engine::Kind k) {
  const auto i = static_cast<std::size_t>(k);
  return m.device.kind_used[i] + m.host.kind_used[i] + m.nvme.kind_used[i];
}

TrainRun train_mlp(const TrainSpec& spec) {
  TrainRun out;
  std::mutex m;
  rethrow_first(run_thread_ranks_with(spec.world, [&](comm::Communicator& c, const comm::CommOptions& co) {
    device::DeviceOptions d;
    d.backend = spec.backend;
    d.guard_memory = spec.guard_memory;
    d.budget_bytes = spec.device_budget;
    const auto rank = static_cast<std::size_t>(c.rank());
    d.link_gbps = rank < spec.rank_link_gbps.size() ? spec.rank_link_gbps[rank] : spec.link_gbps;
    if (spec.pinned_budget) d.pinned_budget_bytes = spec.pinned_budget;
    auto dev = device::Device::create(d);
    std::unique_ptr<comm::Communicator> dcomm;
    if (spec.device_comm) {
      // Its threads are created with access to a guarded device's memory, as NCCL's kernels
      // have to a GPU's.
      device::CpuAccessScope access(*dev);
      auto o = co;
      o.rendezvous.run_id += ".device";
      dcomm = comm::Communicator::create(o);
    }
    engine::EngineOptions eo;
    eo.device_comm = dcomm.get();
    eo.config = spec.config;
    eo.device = dev.get();
    eo.comm = &c;
    eo.seed = 7;
    eo.tracer = c.rank() == 0 ? spec.tracer : nullptr;
    engine::Engine engine(eo);
    StackTrainer mlp(engine, {spec.layers, spec.hidden, spec.layer_ms, 7, spec.frozen}, &c, eo.tracer);
    engine.setup();
    if (!spec.load_checkpoint.empty()) engine.load_checkpoint(spec.load_checkpoint);
    auto initial = spec.read_initial ? engine.full_parameters() : std::vector<float>{};
    std::vector<double> losses, ms;
    std::vector<engine::IoStats> io;
    std::vector<std::int64_t> steps;
    std::vector<engine::StepResult> results;
    for (int s = 0; s < spec.steps; ++s) {
      const auto t0 = std::chrono::steady_clock::now();
      const auto r = mlp.train_step(spec.first_step + s);
      losses.push_back(r.loss);
      steps.push_back(r.result.step);
      results.push_back(r.result);
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      io.push_back(engine.io_stats());
      if (spec.after_step) spec.after_step(engine, s);
    }
    std::vector<engine::SaveResult> saved;
    if (!spec.save_checkpoint.empty()) {
      engine::SaveOptions so;
      so.async = spec.async_save;
      saved.push_back(engine.save_checkpoint(spec.save_checkpoint, "{}", so));
      engine.wait_checkpoint();
    }
    auto params = engine.full_parameters();
    // A kept overlapped step may finish while full_parameters() waits for it: its traffic
    // joins the last step's figures then.
    if (!io.empty()) io.back() = engine.io_stats();
    if (c.rank() == 0) {
      std::lock_guard<std::mutex> lock(m);
      out.params = std::move(params);
      out.initial = std::move(initial);
      out.losses = losses;
      out.step_ms = ms;
      out.memory = engine.memory();
      out.io = io;
      out.step_numbers = steps;
      out.results = results;
      out.saved = saved;
      out.placement = engine.explain_placement();
    }
  }));
  return out;
}

}  // namespace strata::test
