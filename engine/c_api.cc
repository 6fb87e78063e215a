// The C API (strata.h) over the C++ Engine: exceptions become status codes plus a
// thread-local message; nothing throws across the C boundary.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

#include "engine/c_guard.h"
#include "engine/engine.h"
#include "engine/rank_devices.h"
#include "engine/strata.h"
#include "runtime/comm/communicator.h"
#include "runtime/core/error.h"
#include "runtime/device/device.h"

struct strata_engine {
  std::unique_ptr<strata::comm::Communicator> comm;
  std::unique_ptr<strata::comm::Communicator> device_comm;  // NCCL, for ranks on GPUs
  std::unique_ptr<strata::device::Device> device;
  std::unique_ptr<strata::engine::Engine> engine;
  std::vector<std::string> names;  // keeps the view names alive
  std::string loaded_state;        // the trainer state of the last strata_load
};

namespace strata::capi {

namespace {
thread_local std::string g_last_error;
}

void set_last_error(const char* message) { g_last_error = message; }

strata_status status_of(Errc c) noexcept {
  switch (c) {
    case Errc::invalid_argument:
      return STRATA_ERR_INVALID;
    case Errc::out_of_budget:
      return STRATA_ERR_BUDGET;
    case Errc::io:
    case Errc::corrupt:
      return STRATA_ERR_IO;
    case Errc::comm:
    case Errc::timeout:
      return STRATA_ERR_COMM;
    case Errc::unsupported:
    case Errc::cuda:
      return STRATA_ERR_UNSUPPORTED;
    default:
      return STRATA_ERR_INTERNAL;
  }
}

}  // namespace strata::capi

namespace {

using strata::capi::guarded;

strata_dtype c_dtype(strata::DType t) {
  return t == strata::DType::bf16 ? STRATA_BF16 : t == strata::DType::fp16 ? STRATA_FP16 : STRATA_FP32;
}

void fill_views(const std::vector<strata::engine::TensorView>& v, strata_tensor* out, size_t capacity, size_t* count) {
  STRATA_CHECK(count != nullptr, strata::Errc::invalid_argument, "count must not be NULL");
  *count = v.size();
  STRATA_CHECK(out != nullptr || capacity == 0, strata::Errc::invalid_argument, "out is NULL with capacity ", capacity);
  STRATA_CHECK(capacity >= v.size(), strata::Errc::invalid_argument, "capacity ", capacity, " is below the layer's ",
               v.size(), " parameters");
  for (size_t i = 0; i < v.size(); ++i) out[i] = {v[i].data, c_dtype(v[i].dtype), v[i].numel, v[i].name->c_str()};
}

strata::engine::Engine& engine_of(strata_engine* e) {
  STRATA_CHECK(e != nullptr && e->engine, strata::Errc::invalid_argument, "engine is NULL");
  return *e->engine;
}

// A C reader as the engine's WeightReader; a reader that fails names the call and the tensor.
strata::engine::Engine::WeightReader weight_reader(const char* call, strata_weight_reader read, void* user) {
  STRATA_CHECK(read != nullptr, strata::Errc::invalid_argument, call, ": read must not be NULL");
  return [call, read, user](const std::string& name, std::uint64_t elem, std::uint64_t count, float* out) {
    STRATA_CHECK(read(user, name.c_str(), elem, count, out) == 0, strata::Errc::invalid_argument, call,
                 ": the reader failed for tensor '", name, "' (elements ", elem, "-", elem + count, ")");
  };
}

}  // namespace

extern "C" {

const char* strata_last_error(void) { return strata::capi::g_last_error.c_str(); }

strata_status strata_engine_create(const char* config_path, uint64_t device_budget_bytes, uint64_t seed,
                                   strata_engine** out) {
  return strata_engine_create_on(config_path, "host", device_budget_bytes, seed, out);
}

strata_status strata_engine_create_on(const char* config_path, const char* device, uint64_t device_budget_bytes,
                                      uint64_t seed, strata_engine** out) {
  return strata_engine_create_for_model(config_path, device, device_budget_bytes, seed, 0, 0, out);
}

strata_status strata_engine_create_for_model(const char* config_path, const char* device, uint64_t device_budget_bytes,
                                             uint64_t seed, uint64_t hidden_size, int64_t total_steps,
                                             strata_engine** out) {
  return guarded([&] {
    STRATA_CHECK(config_path != nullptr && out != nullptr && device != nullptr, strata::Errc::invalid_argument,
                 "strata_engine_create: config_path, device and out must not be NULL");
    STRATA_CHECK(total_steps >= 0, strata::Errc::invalid_argument, "strata_engine_create_for_model: total_steps ",
                 total_steps, " must be >= 0 (0: not known)");
    *out = nullptr;
    auto e = std::make_unique<strata_engine>();
    strata::comm::CommOptions co;
    co.rendezvous = strata::comm::rendezvous_from_env();
    if (co.rendezvous.world_size > 1) e->comm = strata::comm::Communicator::create(co);
    strata::engine::ModelFacts facts;
    facts.world_size = co.rendezvous.world_size;
    facts.hidden_size = hidden_size;
    facts.total_steps = total_steps;
    const auto cfg = strata::engine::load_config(config_path, facts);
    strata::device::DeviceOptions d;
    d.backend = strata::engine::choose_backend(device, co.rendezvous.world_size);
    d.ordinal = co.rendezvous.local_rank;
    d.budget_bytes = device_budget_bytes        ? device_budget_bytes
                     : cfg.memory_budget.device ? cfg.memory_budget.device
                                                : (uint64_t{1} << 30);
    if (cfg.memory_budget.host) d.pinned_budget_bytes = cfg.memory_budget.host;
    e->device = strata::device::Device::create(d);
    strata::engine::EngineOptions o;
    o.config = cfg;
    o.device = e->device.get();
    e->device_comm = strata::engine::create_device_comm(co, d.backend, d.ordinal);
    o.comm = e->comm.get();
    o.device_comm = e->device_comm.get();
    o.seed = seed;
    e->engine = std::make_unique<strata::engine::Engine>(o);
    *out = e.release();
  });
}

void strata_engine_destroy(strata_engine* engine) { delete engine; }

strata_status strata_register_param(strata_engine* e, const char* name, const int64_t* shape, int ndim, int layer,
                                    strata_init init, float scale) {
  return guarded([&] {
    STRATA_CHECK(name != nullptr && shape != nullptr && ndim > 0, strata::Errc::invalid_argument,
                 "strata_register_param: name, shape and ndim > 0 are required");
    STRATA_CHECK(init >= STRATA_INIT_NORMAL && init <= STRATA_INIT_CONSTANT, strata::Errc::invalid_argument,
                 "strata_register_param('", name, "'): unknown init ", static_cast<int>(init));
    engine_of(e).register_param(name, std::vector<int64_t>(shape, shape + ndim), layer,
                                {static_cast<strata::engine::InitKind>(init), scale});
  });
}

strata_status strata_freeze_layer(strata_engine* e, int layer) {
  return guarded([&] { engine_of(e).freeze_layer(layer); });
}

strata_status strata_offload_states(strata_engine* e, uint64_t* bytes) {
  return guarded([&] {
    const auto r = engine_of(e).offload_states();
    if (bytes != nullptr) *bytes = r.bytes;
  });
}

strata_status strata_reload_states(strata_engine* e, uint64_t* bytes) {
  return guarded([&] {
    const auto r = engine_of(e).reload_states();
    if (bytes != nullptr) *bytes = r.bytes;
  });
}

int strata_states_offloaded(const strata_engine* e) {
  return e != nullptr && e->engine && e->engine->states_offloaded();
}

strata_status strata_setup(strata_engine* e) {
  return guarded([&] { engine_of(e).setup(); });
}
strata_status strata_begin_step(strata_engine* e) {
  return guarded([&] { engine_of(e).begin_step(); });
}
strata_status strata_gather(strata_engine* e, int layer, strata_tensor* out, size_t capacity, size_t* count) {
  return guarded([&] { fill_views(engine_of(e).gather(layer), out, capacity, count); });
}
strata_status strata_release(strata_engine* e, int layer) {
  return guarded([&] { engine_of(e).release(layer); });
}
strata_status strata_grad_buffers(strata_engine* e, int layer, strata_tensor* out, size_t capacity, size_t* count) {
  return guarded([&] { fill_views(engine_of(e).grad_buffers(layer), out, capacity, count); });
}
strata_status strata_reduce_grads(strata_engine* e, int layer) {
  return guarded([&] { engine_of(e).reduce_grads(layer); });
}

strata_status strata_step(strata_engine* e, strata_step_result* out) {
  return guarded([&] {
    const auto r = engine_of(e).step();
    if (out != nullptr) *out = {r.step, r.skipped ? 1 : 0, r.grad_norm, r.loss_scale, r.lr};
  });
}

strata_status strata_abandon_step(strata_engine* e) {
  return guarded([&] { engine_of(e).abandon_step(); });
}

strata_status strata_begin_eval(strata_engine* e) {
  return guarded([&] { engine_of(e).begin_eval(); });
}
strata_status strata_end_eval(strata_engine* e) {
  return guarded([&] { engine_of(e).end_eval(); });
}

float strata_loss_scale(const strata_engine* e) { return e && e->engine ? e->engine->loss_scale() : 0.0f; }
int64_t strata_accumulation_steps(const strata_engine* e) {
  return e && e->engine ? std::max<int64_t>(1, e->engine->config().gradient_accumulation_steps) : 0;
}
strata_dtype strata_compute_dtype(const strata_engine* e) {
  if (!e || !e->engine) return STRATA_FP32;
  const auto t = e->engine->compute_dtype();
  return t == strata::DType::bf16 ? STRATA_BF16 : t == strata::DType::fp16 ? STRATA_FP16 : STRATA_FP32;
}
int strata_rank(const strata_engine* e) { return e && e->engine ? e->engine->rank() : -1; }
int strata_world_size(const strata_engine* e) { return e && e->engine ? e->engine->world_size() : 0; }

strata_status strata_memory(const strata_engine* e, strata_memory_report* out) {
  return guarded([&] {
    STRATA_CHECK(e != nullptr && e->engine && out != nullptr, strata::Errc::invalid_argument,
                 "strata_memory: engine and out must not be NULL");
    const auto m = e->engine->memory();
    const auto usage = [](const strata::engine::TierUsage& t) {
      using strata::engine::Kind;
      const auto of = [&t](Kind k) { return t.kind_used[static_cast<std::size_t>(k)]; };
      return strata_tier_usage{t.used_bytes,    t.peak_bytes,        t.budget_bytes,   of(Kind::params),
                               of(Kind::grads), of(Kind::optimizer), of(Kind::buffers)};
    };
    out->device = usage(m.device);
    out->host = usage(m.host);
    out->nvme = usage(m.nvme);
  });
}

strata_status strata_io_stats(const strata_engine* e, strata_io_report* out) {
  return guarded([&] {
    STRATA_CHECK(e != nullptr && e->engine && out != nullptr, strata::Errc::invalid_argument,
                 "strata_io_stats: engine and out must not be NULL");
    const auto s = e->engine->io_stats();
    *out = {s.h2d_bytes, s.d2h_bytes, s.nvme_read_bytes, s.nvme_write_bytes, s.io_wait_seconds, s.step_seconds};
  });
}

strata_status strata_synchronize(strata_engine* e) {
  return guarded([&] { engine_of(e).synchronize(); });
}

strata_status strata_full_parameters(strata_engine* e, float* out, size_t capacity, size_t* count) {
  return guarded([&] {
    const auto all = engine_of(e).full_parameters();
    STRATA_CHECK(count != nullptr, strata::Errc::invalid_argument, "count must not be NULL");
    *count = all.size();
    STRATA_CHECK(capacity >= all.size() && out != nullptr, strata::Errc::invalid_argument, "capacity ", capacity,
                 " is below the model's ", all.size(), " parameters");
    std::copy(all.begin(), all.end(), out);
  });
}

strata_status strata_layer_parameters(strata_engine* e, int layer, float* out, size_t capacity, size_t* count) {
  return guarded([&] {
    STRATA_CHECK(count != nullptr, strata::Errc::invalid_argument, "count must not be NULL");
    const auto values = engine_of(e).layer_parameters(layer);
    *count = values.size();
    STRATA_CHECK(capacity >= values.size() && out != nullptr, strata::Errc::invalid_argument, "capacity ", capacity,
                 " is below layer ", layer, "'s ", values.size(), " parameters");
    std::copy(values.begin(), values.end(), out);
  });
}

strata_status strata_save(strata_engine* e, const char* root, const char* trainer_state, int keep) {
  return guarded([&] {
    STRATA_CHECK(root != nullptr, strata::Errc::invalid_argument, "strata_save: root must not be NULL");
    strata::engine::SaveOptions so;
    so.keep = keep;
    engine_of(e).save_checkpoint(root, trainer_state != nullptr ? trainer_state : "{}", so);
  });
}

strata_status strata_load(strata_engine* e, const char* path, char* trainer_state_out, size_t capacity) {
  return guarded([&] {
    STRATA_CHECK(path != nullptr, strata::Errc::invalid_argument, "strata_load: path must not be NULL");
    const std::string state = engine_of(e).load_checkpoint(path);
    e->loaded_state = state;
    if (trainer_state_out == nullptr) return;
    STRATA_CHECK(capacity > state.size(), strata::Errc::invalid_argument, "strata_load: the trainer state (",
                 state.size() + 1, " bytes with its NUL) does not fit in capacity ", capacity,
                 "; the checkpoint itself was loaded");
    std::memcpy(trainer_state_out, state.c_str(), state.size() + 1);
  });
}

strata_status strata_loaded_trainer_state(strata_engine* e, char* out, size_t capacity, size_t* size) {
  return guarded([&] {
    engine_of(e);  // checks the handle
    STRATA_CHECK(size != nullptr, strata::Errc::invalid_argument, "strata_loaded_trainer_state: size must not be NULL");
    *size = e->loaded_state.size() + 1;
    if (out == nullptr) return;
    STRATA_CHECK(capacity >= *size, strata::Errc::invalid_argument, "strata_loaded_trainer_state: the trainer state (",
                 *size, " bytes with its NUL) does not fit in capacity ", capacity);
    std::memcpy(out, e->loaded_state.c_str(), *size);
  });
}

strata_status strata_init_weights(strata_engine* e, strata_weight_reader read, void* user) {
  return guarded([&] { engine_of(e).init_weights(weight_reader("strata_init_weights", read, user)); });
}

strata_status strata_write_weights(strata_engine* e, strata_weight_reader read, void* user, int source_rank) {
  return guarded([&] { engine_of(e).write_weights(weight_reader("strata_write_weights", read, user), source_rank); });
}

}  // extern "C"
