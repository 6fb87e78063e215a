// Checkpoints of a pipelined run (see pipelined_checkpoint.h).
#include "train/pipelined_checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <vector>

#include "checkpoint/directory.h"
#include "checkpoint/format.h"

#include "engine/engine.h"
#include "models/gpt/fp8_products.h"
#include "models/safetensors.h"
#include "runtime/core/error.h"
#include "train/checkpoints.h"

namespace strata::train {

engine::StageStore::LayerValues PipelineCheckpoints::initial_values(const PipelinedModel& model) const {
  if (init_from.empty()) return {};
  {
    model::SafetensorsReader file(init_from);
    WantedTensors wanted;
    for (const auto& t : model.tensors) wanted.emplace_back(t.name, t.shape);
    check_init_file(file, init_from, wanted);
  }
  return [path = init_from, layer_tensors = model.layer_tensors](int layer, std::size_t count, float* out) {
    model::SafetensorsReader file(path);
    std::size_t at = 0;
    for (const auto& t : layer_tensors(layer)) {
      if (at == count) break;  // a tied tail: its owner's
      const auto* info = file.find(t.name);
      STRATA_CHECK(info != nullptr && info->shape == t.shape && at + info->numel <= count, Errc::invalid_argument,
                   "--init-from '", path, "': tensor '", t.name,
                   "' is gone or changed shape since the run checked it; keep the file unchanged while it starts");
      read_init_values(file, path, *info, 0, info->numel, out + at);  // refuses NaN and infinities
      at += info->numel;
    }
    STRATA_CHECK(at == count, Errc::internal, "--init-from: pipeline layer ", layer, " holds ", count,
                 " parameters, and its tensors give ", at);
  };
}

std::string PipelineCheckpoints::stage_root(const std::string& root, int stage) const {
  return root + "/stage" + std::to_string(stage);
}

namespace {
// Every rank's value (one double each), or this rank's alone.
std::vector<double> everyone(comm::Communicator* all, double mine) {
  if (all == nullptr) return {mine};
  std::vector<double> v(static_cast<std::size_t>(all->world_size()));
  all->all_gather(&mine, v.data(), 2, DType::fp32);  // a double as two fp32 words
  return v;
}
}  // namespace

std::int64_t PipelineCheckpoints::load(engine::Engine& engine, int stage, comm::Communicator* all,
                                       model::Fp8Products* fp8) const {
  if (resume.empty()) return 0;
  const std::string root = stage_root(resume, stage);
  const auto saved = checkpoint::list_checkpoints(root);
  STRATA_CHECK(!saved.empty(), Errc::invalid_argument, "--resume '", resume, "': ", root,
               " holds no checkpoint; a pipelined run saves one directory per stage under its --save-dir");
  // The newest step every stage saved: a run stopped between two stages' saves leaves
  // some stages one save ahead, and those still hold the older one (unless keep dropped it).
  const auto latest = everyone(all, static_cast<double>(saved.back()));
  const auto target = static_cast<std::int64_t>(*std::min_element(latest.begin(), latest.end()));
  const bool have = std::binary_search(saved.begin(), saved.end(), target);
  const auto held = everyone(all, have ? 1.0 : 0.0);
  for (std::size_t q = 0; q < held.size(); ++q) {
    STRATA_CHECK(held[q] == 1.0, Errc::invalid_argument, "--resume '", resume, "': rank ", q,
                 "'s stage has no checkpoint of step ", target,
                 ", the newest that every stage saved (the run stopped between two stages' saves and `keep` removed "
                 "it): the stages cannot resume together");
  }
  if (target != saved.back())
    std::printf("stage %d: resuming from step %lld, the newest every stage saved (its own latest is %lld)\n", stage,
                static_cast<long long>(target), static_cast<long long>(saved.back()));
  // The trainer's state first (from the manifest): another stage count would register other
  // tensors, and the engine's refusal would not say why.
  const std::string dir = root + "/" + checkpoint::step_dir_name(target);
  const auto j = nlohmann::json::parse(checkpoint::open_checkpoint(dir).manifest.trainer_state, nullptr, false);
  STRATA_CHECK(!j.is_discarded() && j.contains("next_step") && j.contains("pipeline_stages") && j.contains("seed"),
               Errc::invalid_argument, "--resume '", resume, "': ", root,
               " holds no pipelined strata train state (next_step, seed, pipeline_stages)");
  const int saved_stages = j.at("pipeline_stages").get<int>();
  STRATA_CHECK(saved_stages == stages, Errc::invalid_argument, "--resume '", resume, "': saved by ", saved_stages,
               " pipeline stages, and this run has --pipeline-stages ", stages, "; resume with ", saved_stages);
  const auto seed_saved = j.at("seed").get<std::uint64_t>();
  STRATA_CHECK(seed_saved == seed, Errc::invalid_argument, "--resume '", resume, "': trained with --seed ", seed_saved,
               " but this run has --seed ", seed, "; its data would differ: pass --seed ", seed_saved);
  try {
    check_unit_scaling(j, unit_scaled);
    if (check_model_state) check_model_state(j.contains("model") ? j.at("model").dump() : std::string());
    if (fp8 != nullptr) {
      if (auto h = saved_fp8_history(j, stage == 0)) fp8->restore(*h);
    }
  } catch (const Error& e) {
    throw Error(e.code(), str_cat("--resume '", resume, "': ", e.what()));
  }
  engine.load_checkpoint(dir);
  return j.at("next_step").get<std::int64_t>();
}

namespace {
// A stage's asynchronous saves that finished since the last call, one line each.
// Returns the error of the last failed save reported, or "".
std::string report_finished(engine::Engine& engine, int stage, bool printer) {
  std::string failed;
  for (const auto& r : engine.finished_checkpoints()) {
    if (!r.committed) {
      std::printf(
          "stage %d: checkpoint step %lld failed in the background: %s; the stage's previous checkpoint stays "
          "latest\n",
          stage, static_cast<long long>(r.step), r.error.c_str());
      failed = r.error;
    } else {
      if (printer) print_saved(r);
      failed.clear();
    }
  }
  std::fflush(stdout);
  return failed;
}
}  // namespace

bool PipelineCheckpoints::after_step(engine::Engine& engine, int stage, std::int64_t s, std::int64_t steps,
                                     bool printer, const model::Fp8Products* fp8) const {
  if (save_dir.empty()) return false;
  report_finished(engine, stage, printer);
  const bool due = s + 1 == steps || (save_every > 0 && (s + 1) % save_every == 0);
  if (!due) return false;
  nlohmann::json state{{"next_step", s + 1}, {"seed", seed}, {"pipeline_stages", stages}};
  record_unit_scaling(state, unit_scaled);
  if (!model_state.empty()) state["model"] = nlohmann::json::parse(model_state);
  if (fp8 != nullptr) record_fp8_history(state, fp8->histories());
  engine::SaveOptions so;
  so.keep = keep;
  so.async = async;
  engine.save_checkpoint(stage_root(save_dir, stage), state.dump(), so);
  return true;
}

std::string PipelineCheckpoints::finish(engine::Engine& engine, int stage, bool printer) const {
  if (save_dir.empty() || !async) return {};
  engine.wait_checkpoint();
  return report_finished(engine, stage, printer);
}

void PipelineCheckpoints::finish_all(engine::Engine& engine, int stage, int D, comm::Communicator* all,
                                     bool printer) const {
  if (save_dir.empty() || !async) return;  // the same on every rank: synchronous saves throw where they fail
  const std::string failed = finish(engine, stage, printer);
  float mine = failed.empty() ? 0.0f : 1.0f;
  std::vector<float> flags{mine};
  if (all != nullptr && all->world_size() > 1) {
    flags.resize(static_cast<std::size_t>(all->world_size()));
    all->all_gather(&mine, flags.data(), 1, DType::fp32);
  }
  std::string names;
  int last = -1;
  for (std::size_t q = 0; q < flags.size(); ++q) {
    const int st = all != nullptr && all->world_size() > 1 ? static_cast<int>(q) / D : stage;
    if (flags[q] != 0.0f && st != last) {
      names += str_cat(names.empty() ? "" : ", ", st);
      last = st;
    }
  }
  STRATA_CHECK(names.empty(), Errc::io, "the last checkpoint save failed on stage ", names,
               failed.empty() ? std::string() : ": " + failed, "; each stage's previous checkpoint under ", save_dir,
               " stays latest (resume takes the newest step every stage committed)");
}

}  // namespace strata::train
