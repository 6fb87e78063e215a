// strata train's checkpoint flags and when it saves and resumes (checkpoints.h).
#include "train/checkpoints.h"

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "models/safetensors.h"
#include "runtime/comm/communicator.h"
#include "runtime/core/error.h"
#include "runtime/core/units.h"
#include "train/interrupt.h"
#include "train/output_check.h"

namespace strata::train {

void print_saved(const engine::SaveResult& r) {
  std::string nvme;
  if (r.nvme_linked_bytes) nvme += str_cat(", NVMe state linked: ", format_bytes(r.nvme_linked_bytes));
  if (r.nvme_copied_bytes) nvme += str_cat(", NVMe state copied: ", format_bytes(r.nvme_copied_bytes));
  if (r.async) {
    std::printf(
        "           checkpoint: %s committed (%s written in the background, committed %.3f s after it was "
        "staged%s)\n",
        r.dir.c_str(), format_bytes(r.bytes).c_str(), r.seconds, nvme.c_str());
  } else {
    std::printf("           checkpoint: %s committed (%s written in %.3f s, %.2f GB/s%s)\n", r.dir.c_str(),
                format_bytes(r.bytes).c_str(), r.seconds,
                r.seconds > 0 ? static_cast<double>(r.bytes) / r.seconds / 1e9 : 0.0, nvme.c_str());
  }
}

TrainCheckpoints::TrainCheckpoints(const CheckpointFlags& f, const engine::CheckpointConfig& c, std::uint64_t seed,
                                   TrainModel& model)
    : save_dir_(f.save_dir.empty() ? c.save_dir : f.save_dir),
      resume_(f.resume),
      init_from_(f.init_from),
      save_every_(f.save_every >= 0 ? f.save_every : c.save_every),
      keep_(f.keep >= 0 ? f.keep : c.keep),
      async_(f.async || c.async),
      seed_(seed),
      model_(&model) {
  STRATA_CHECK(resume_.empty() || init_from_.empty(), Errc::invalid_argument,
               "--resume and --init-from both given: a resumed run continues its checkpoint; pick one");
  if (resume_ == "latest") {
    STRATA_CHECK(!save_dir_.empty(), Errc::invalid_argument,
                 "--resume latest needs --save-dir (or checkpoint.save_dir in the config): the directory whose "
                 "latest checkpoint to load");
    resume_ = save_dir_;
  }
  if (!save_dir_.empty()) check_output_dir("--save-dir", save_dir_);  // before training, not at the first save
}

void check_init_file(const model::SafetensorsReader& file, const std::string& path, const WantedTensors& wanted) {
  for (const auto& [name, shape] : wanted) {
    const auto* t = file.find(name);
    STRATA_CHECK(t != nullptr, Errc::invalid_argument, "--init-from '", path, "' has no tensor '", name,
                 "', which this model registers");
    STRATA_CHECK(t->shape == shape, Errc::invalid_argument, "--init-from '", path, "': tensor '", name, "' has shape ",
                 format_shape(t->shape), " but the model's is ", format_shape(shape));
  }
  std::unordered_set<std::string> registered;
  for (const auto& w : wanted) registered.insert(w.first);
  for (const auto& t : file.tensors()) {
    STRATA_CHECK(registered.count(t.name) != 0, Errc::invalid_argument, "--init-from '", path, "' has tensor '", t.name,
                 "', which this model does not register");
  }
}

void read_init_values(model::SafetensorsReader& file, const std::string& path, const model::TensorInfo& t,
                      std::uint64_t elem, std::uint64_t count, float* out) {
  file.read(t, elem, count, out);
  for (std::uint64_t i = 0; i < count; ++i) {
    STRATA_CHECK(std::isfinite(out[i]), Errc::invalid_argument, "--init-from '", path, "': tensor '", t.name,
                 "' holds ", out[i], " at element ", elem + i, " (of ", t.numel,
                 "): training cannot start from non-finite weights; fix or re-export the file");
  }
}

void TrainCheckpoints::init_from(engine::Engine& engine) const {
  model::SafetensorsReader file(init_from_);
  const auto& params = engine.layout().params();
  WantedTensors wanted;
  for (const auto& p : params) wanted.emplace_back(p.name, p.shape);
  check_init_file(file, init_from_, wanted);
  engine.init_weights([&](const std::string& name, std::uint64_t elem, std::uint64_t count, float* out) {
    read_init_values(file, init_from_, *file.find(name), elem, count, out);
  });
  if (engine.rank() == 0) std::printf("initialised %zu tensors from %s\n", params.size(), init_from_.c_str());
}

void require_steps_after_resume(std::int64_t first, std::int64_t steps, const std::string& resume) {
  STRATA_CHECK(first < steps, Errc::invalid_argument, "--steps ", steps, ": the checkpoint this run resumes (", resume,
               ") has trained ", first,
               " steps already, so the run would train nothing: --steps is the total to "
               "reach, give more than ",
               first);
}

std::int64_t TrainCheckpoints::resume(engine::Engine& engine) const {
  if (!init_from_.empty()) init_from(engine);
  if (resume_.empty()) return 0;
  const std::string text = engine.load_checkpoint(resume_);
  std::int64_t next = 0;
  std::uint64_t seed = 0;
  std::string model_state;
  try {
    const auto j = nlohmann::json::parse(text);
    next = j.at("next_step").get<std::int64_t>();
    seed = j.at("seed").get<std::uint64_t>();
    if (j.contains("model")) model_state = j.at("model").dump();
  } catch (const nlohmann::json::exception& e) {
    STRATA_THROW(Errc::invalid_argument, "--resume '", resume_,
                 "': the checkpoint has no strata train state (next_step, seed): it was not saved by strata train (",
                 e.what(), ")");
  }
  STRATA_CHECK(seed == seed_, Errc::invalid_argument, "--resume '", resume_,
               "': the checkpoint was trained with --seed ", seed, " but this run has --seed ", seed_,
               "; its data would differ: pass --seed ", seed);
  try {
    model_->restore_state(model_state);
  } catch (const nlohmann::json::exception& e) {
    STRATA_THROW(Errc::corrupt, "--resume '", resume_, "': the model's state in the checkpoint is malformed (",
                 e.what(), ")");
  } catch (const Error& e) {
    throw Error(e.code(), str_cat("--resume '", resume_, "': ", e.what()));
  }
  if (engine.rank() == 0) {
    std::printf("resumed from %s: continuing at step %lld\n", resume_.c_str(), static_cast<long long>(next + 1));
  }
  return next;
}

void TrainCheckpoints::after_step(engine::Engine& engine, std::int64_t s, std::int64_t steps) const {
  report(engine, false);
  if (save_dir_.empty()) return;
  const bool last = s + 1 == steps;
  if (!last && (save_every_ <= 0 || (s + 1) % save_every_ != 0)) return;
  const auto r = save(engine, s + 1, async_);
  if (engine.rank() != 0) return;
  if (r.async) {
    std::printf("           checkpoint: %s staged in %.3f s, writing in the background\n", r.dir.c_str(), r.seconds);
  } else {
    print_saved(r);
  }
  std::fflush(stdout);
}

engine::SaveResult TrainCheckpoints::save(engine::Engine& engine, std::int64_t next_step, bool async) const {
  nlohmann::json j{{"next_step", next_step}, {"seed", seed_}};
  if (const std::string m = model_->state(); !m.empty()) j["model"] = nlohmann::json::parse(m);
  const std::string state = j.dump();
  engine::SaveOptions so;
  so.keep = keep_;
  so.async = async;
  return engine.save_checkpoint(save_dir_, state, so);
}

void TrainCheckpoints::stop_if_interrupted(engine::Engine& engine, comm::Communicator* comm, std::int64_t s,
                                           std::int64_t first) const {
  if (save_dir_.empty()) {
    check_interrupted("train");
    return;
  }
  float any = interrupt_pending() ? 1.0f : 0.0f;
  if (comm != nullptr && engine.world_size() > 1) comm->all_reduce(&any, 1, DType::fp32, comm::ReduceOp::max);
  if (any == 0.0f) return;
  engine.wait_checkpoint();
  report(engine, false);
  const bool saved_already = save_every_ > 0 && s % save_every_ == 0;
  if (s > first && !saved_already) {
    const auto r = save(engine, s, false);
    if (engine.rank() == 0) print_saved(r);
  }
  STRATA_THROW(Errc::invalid_argument, "train: interrupted before step ", s + 1, "; the state after step ", s,
               " is in ", save_dir_, " (resume with --resume ", save_dir_, ")");
}

void TrainCheckpoints::report(engine::Engine& engine, bool throw_on_failure) const {
  for (const auto& r : engine.finished_checkpoints()) {
    if (!r.committed) {
      STRATA_CHECK(!throw_on_failure, Errc::io, "the last checkpoint save failed: ", r.error);
      if (engine.rank() == 0) std::printf("           checkpoint FAILED: %s\n", r.error.c_str());
      continue;
    }
    if (engine.rank() == 0) print_saved(r);
  }
  std::fflush(stdout);
}

void TrainCheckpoints::finish(engine::Engine& engine) const {
  if (save_dir_.empty()) return;
  engine.wait_checkpoint();
  report(engine, true);
}

}  // namespace strata::train
