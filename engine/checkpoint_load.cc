// CheckpointLoad (checkpoint_load.h; the protocol in engine.h), and the engine's own state a
// checkpoint restores (step counters, loss scaler, what the optimizer state means).
//
// A load is all-or-nothing. It runs in two collective phases: the first opens the
// checkpoint, checks its tensors against the model and its recorded optimizer and
// precision against this run, and reads every range this rank will load (each chunk
// verified against its checksum) without changing anything; only when every rank passed
// does the second read them again and write them. Corrupt, truncated, mismatched or
// missing input so fails before any state changes, and training goes on from the state
// it had. Writes of optimizer state and parameter shards on NVMe go to the stores' spare
// files (committed only when every layer was written, or sub-groups and chunks as they go
// when a store's spares run out): the files a checkpoint hard-linked are never written. The
// one failure left in the second phase, an I/O error writing NVMe state, discards those
// writes; the state in device and host memory may then be part loaded, and the engine
// refuses to train until a load succeeds.
#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "checkpoint/directory.h"
#include "checkpoint/format.h"
#include "checkpoint/shard_file.h"
#include "engine/checkpoint_load.h"
#include "engine/detail/checkpoint_ranges.h"
#include "runtime/comm/communicator.h"
#include "runtime/core/error.h"
#include "runtime/core/log.h"
#include "runtime/core/units.h"

namespace strata::engine {
namespace {

using checkpoint::State;

// Optimizers whose saved state means the same thing: Adam and AdamW keep the same moments.
std::string state_family(const std::string& optimizer) { return optimizer == "Adam" ? "AdamW" : optimizer; }

// Runs fn; a strata::Error it throws gains `suffix`, which says what became of the state.
std::function<void()> telling(const std::function<void()>& fn, const char* suffix) {
  return [fn, suffix] {
    try {
      fn();
    } catch (const Error& e) {
      throw Error(e.code(), str_cat(e.what(), suffix), e.where(), e.sys_errno());
    }
  };
}

constexpr const char* kUnchanged = " (nothing was changed: the engine's state is as before the load)";
constexpr const char* kMixed =
    " (the state is partly loaded: training is refused until a load succeeds, so load a checkpoint again)";

}  // namespace

StepScalars::Counters CheckpointLoad::loaded_counters(const checkpoint::Manifest& m, const std::string& where) const {
  StepScalars::Counters c;
  std::string saved_optimizer, saved_scaling;
  double saved_scale = 0;
  try {
    const auto j = nlohmann::json::parse(m.engine_state);
    const auto& ls = j.at("loss_scaler");
    auto& s = c.scaler;
    s.scale = ls.at("scale").get<double>();
    saved_scale = s.scale;
    s.iteration = ls.at("iteration").get<std::int64_t>();
    s.last_overflow_iteration = ls.at("last_overflow_iteration").get<std::int64_t>();
    s.hysteresis_left = ls.at("hysteresis_left").get<int>();
    c.steps_taken = j.at("steps_taken").get<std::int64_t>();
    c.step_calls = j.at("step_calls").get<std::int64_t>();
    if (j.contains("optimizer")) saved_optimizer = j.at("optimizer").get<std::string>();
    if (j.contains("loss_scaling")) saved_scaling = j.at("loss_scaling").get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    STRATA_THROW(Errc::corrupt, "checkpoint '", where, "': the manifest's engine state is incomplete (", e.what(), ")");
  }
  STRATA_CHECK(
      c.steps_taken >= 0 && c.step_calls >= c.steps_taken && c.scaler.scale > 0 && c.scaler.hysteresis_left >= 0,
      Errc::corrupt, "checkpoint '", where, "': the manifest's engine state is out of range (steps_taken ",
      c.steps_taken, ", step_calls ", c.step_calls, ", loss scale ", c.scaler.scale, ")");
  const std::string mine = optimizer_type_name(c_.cfg.optimizer.type);
  if (saved_optimizer.empty()) {
    STRATA_LOG(warn, "checkpoint '", where,
               "' does not record its optimizer (an earlier Strata saved it): it is read as ", mine,
               "'s state; resume with the optimizer it was trained with");
  } else {
    STRATA_CHECK(state_family(saved_optimizer) == state_family(mine), Errc::invalid_argument, "checkpoint '", where,
                 "' holds ", saved_optimizer, " optimizer state, and this run's optimizer.type is ", mine,
                 ": its moments mean something else (", mine, " would start from ", saved_optimizer,
                 "'s state). Set optimizer.type to ", saved_optimizer, ", or start ", mine,
                 " from the weights alone (strata export, then --init-from)");
    if (saved_optimizer != mine)
      STRATA_LOG(info, "checkpoint '", where, "': ", saved_optimizer, " state continues as ", mine, " (same moments)");
  }
  // The loss scaler's state carries over only between runs that scale alike; otherwise this
  // run's scaler starts from its config (an fp16 run resumed from an fp32 or bf16 checkpoint
  // starts at fp16.initial_scale_power, not at the scale 1 that run had).
  // A checkpoint of an earlier Strata does not record it: only fp16 runs had a scaler.
  if (saved_scaling.empty())
    saved_scaling = m.compute_dtype == "fp16" ? detail::scaling_name(c_.scalars.scaler_config(), true) : "none";
  const std::string scaling = detail::scaling_name(c_.scalars.scaler_config(), c_.cfg.fp16.enabled);
  const auto fresh = optim::LossScaler(c_.scalars.scaler_config()).state();  // this run's config, as at setup
  if (saved_scaling != scaling) {
    c.scaler = fresh;
    STRATA_LOG(warn, "checkpoint '", where, "' was saved with loss scaling '", saved_scaling, "' and this run's is '",
               scaling, "': the loss scaler starts from this run's config (scale ", fresh.scale,
               "), not from the checkpoint's scale ", saved_scale);
  } else if (scaling != "dynamic") {
    c.scaler = fresh;  // a static or absent scaler has no state but its config
  }
  if (m.compute_dtype != dtype_name(c_.cdt)) {
    STRATA_LOG(info, "checkpoint '", where, "' was trained in ", m.compute_dtype, "; this run computes in ",
               dtype_name(c_.cdt), " (the fp32 masters carry over exactly)");
  }
  if (const MomentFormat f = c_.state.moment_format(); m.moment_dtype != moment_format_name(f)) {
    STRATA_LOG(info, "checkpoint '", where, "' holds ", m.moment_dtype, " optimizer moments; this run keeps ",
               moment_format_name(f),
               f == MomentFormat::fp32   ? " (widened exactly)"
               : f == MomentFormat::bf16 ? " (rounded to nearest even)"
                                         : " (coded in 8 bits with a scale per 16 elements)");
  }
  return c;
}

// Reads `read(param, state, first element, count, out)`: the master weights and, with
// `moments`, exp_avg and exp_avg_sq (else zeros). Without `apply` only reads (every chunk
// verified), so a bad input fails before anything changes.
void CheckpointLoad::load_layers(const StateReader& read, Moments moments, bool apply,
                                 const std::function<void(std::size_t li)>& before_layer) {
  const Layout& lay = c_.layout;
  auto read_pieces = [&](int li, int state, bool whole, float* out) {
    for (const auto& pc : pieces(li, whole)) {
      detail::for_each_param_range(lay, lay.layers()[li], pc,
                                   [&](int pi, std::size_t elem, std::size_t index, std::size_t count) {
                                     read(pi, state, elem, count, out + index);
                                   });
    }
  };
  const bool stage0 = c_.cfg.zero.stage == 0;
  std::vector<float> st[checkpoint::kStates], full;
  for (std::size_t li = 0; li < c_.layout.layers().size(); ++li) {
    const int l = static_cast<int>(li);
    if (before_layer) before_layer(li);
    const bool frozen = lay.layers()[li].frozen;  // values only: no masters or moments to write
    const bool with_moments = moments != Moments::zero && !frozen;
    for (int s = 0; s < (moments == Moments::read && !frozen ? checkpoint::kStates : 1); ++s) {
      st[s].assign(c_.state.elems(l), 0.0f);  // padding stays zero
      read_pieces(l, s, stage0, st[s].data());
    }
    const float* whole = st[0].data();
    if (!stage0 && c_.homes.full(static_cast<int>(li)) != nullptr) {
      full.assign(lay.layers()[li].padded, 0.0f);
      read_pieces(l, 0, true, full.data());
      whole = full.data();
    }
    if (!apply) continue;
    if (moments == Moments::kept && !frozen) {
      for (int s = 1; s < checkpoint::kStates; ++s) st[s].resize(c_.state.elems(l));
      c_.state.read(l, nullptr, st[1].data(), st[2].data());
    }
    if (!frozen)
      c_.state.write(l, st[0].data(), with_moments ? st[1].data() : nullptr, with_moments ? st[2].data() : nullptr);
    c_.homes.write(l, whole, st[0].data());
  }
}

void CheckpointLoad::commit_loaded() {
  c_.state.commit_writes();
  c_.homes.commit_writes();
  state_mixed_ = false;
}

void CheckpointLoad::discard_loaded() noexcept {
  c_.state.discard_writes();
  c_.homes.discard_writes();
  state_mixed_ = true;
}

void CheckpointLoad::load_all_or_nothing(const StateReader& read, Moments moments, const std::string& what,
                                         const std::function<void()>& on_success,
                                         const std::function<void(std::size_t li)>& before_layer) {
  detail::all_or_nothing(c_.ranks, telling([&] { load_layers(read, moments, false, before_layer); }, kUnchanged), what);
  detail::all_or_nothing(c_.ranks,
                         telling(
                             [&] {
                               load_layers(read, moments, true, before_layer);
                               if (on_success) on_success();
                             },
                             kMixed),
                         what, [&] { discard_loaded(); });
  commit_loaded();
}

// Rank 0 resolves a root to the step directory its `latest` names (or the one the fallback
// chooses) and every rank loads that one: resolved on each rank, a `latest` read torn or
// failing on one rank would load its shards from another step than the others'.
std::string CheckpointLoad::resolve(const std::string& path, const std::string& what) {
  if (c_.ranks.comm == nullptr || c_.ranks.world == 1) return path;
  std::string dir;
  detail::all_or_nothing(c_.ranks,
                         telling(
                             [&] {
                               if (c_.ranks.rank == 0) dir = checkpoint::open_checkpoint(path).dir;
                             },
                             kUnchanged),
                         what);
  // Sent as fp32 words (bytes moved, never added): the length, then the padded text.
  std::uint64_t n = dir.size();
  c_.ranks.comm->broadcast(&n, 2, DType::fp32, 0);
  std::vector<float> words((n + 3) / 4, 0.0f);
  if (c_.ranks.rank == 0) std::memcpy(words.data(), dir.data(), n);
  if (!words.empty()) c_.ranks.comm->broadcast(words.data(), words.size(), DType::fp32, 0);
  dir.assign(reinterpret_cast<const char*>(words.data()), n);
  return dir;
}

std::string CheckpointLoad::load(const std::string& path) {
  const std::string what = str_cat("loading checkpoint '", path, "'");
  checkpoint::Opened opened;
  std::vector<const checkpoint::TensorEntry*> entry;
  StepScalars::Counters counters;
  const std::string dir = resolve(path, what);
  // Everything but the bytes is checked first; then load_all_or_nothing reads them.
  auto check = [&] {
    std::vector<std::string> unfrozen;  // trainable here, saved frozen
    opened = checkpoint::open_checkpoint(dir);
    const auto& m = opened.manifest;
    const Layout& lay = c_.layout;
    for (const auto& p : lay.params()) {
      const auto* t = m.find(p.name);
      STRATA_CHECK(t != nullptr, Errc::invalid_argument, "checkpoint '", opened.dir, "' has no tensor '", p.name,
                   "': it was saved from another model (check the model flags)");
      STRATA_CHECK(t->shape == p.shape, Errc::invalid_argument, "checkpoint '", opened.dir, "': tensor '", p.name,
                   "' has shape ", format_shape(t->shape), " there but ", format_shape(p.shape),
                   " in this model (check the model flags)");
      entry.push_back(t);
      if (!t->has_moments() && !lay.layers()[static_cast<std::size_t>(lay.layer_index(p.layer))].frozen)
        unfrozen.push_back(p.name);
    }
    if (!unfrozen.empty() && c_.ranks.rank == 0) {
      STRATA_LOG(info, "checkpoint '", opened.dir, "': ", unfrozen.size(),
                 " tensors were saved frozen, without "
                 "optimizer moments ('",
                 unfrozen.front(), "'", unfrozen.size() > 1 ? ", ..." : "",
                 "); they train here with moments from zero");
    }
    std::unordered_set<std::string> registered;
    for (const auto& p : lay.params()) registered.insert(p.name);
    for (const auto& t : m.tensors) {
      STRATA_CHECK(registered.count(t.name) != 0, Errc::invalid_argument, "checkpoint '", opened.dir, "' has tensor '",
                   t.name, "', which this model does not register: it was saved from another model");
    }
    counters = loaded_counters(m, opened.dir);
  };
  detail::all_or_nothing(c_.ranks, telling(check, kUnchanged), what);
  checkpoint::ShardReader reader(opened.dir, opened.manifest);
  load_all_or_nothing(
      [&](int pi, int state, std::uint64_t elem, std::uint64_t count, float* out) {
        if (state > 0 && !entry[pi]->has_moments())
          std::fill(out, out + count, 0.0f);  // saved frozen
        else
          reader.read_tensor(*entry[pi], static_cast<State>(state), elem, count, out);
      },
      Moments::read, what, [&] { c_.scalars.restore(counters); });
  return opened.manifest.trainer_state;
}

void CheckpointLoad::init_weights(const Engine::WeightReader& read) {
  const auto& params = c_.layout.params();
  load_all_or_nothing([&](int pi, int, std::uint64_t elem, std::uint64_t count,
                          float* out) { read(params[pi].name, elem, count, out); },
                      Moments::zero, "init_weights (the initial weights were kept)");
}

void CheckpointLoad::write_weights(const Engine::WeightReader& read, int source_rank) {
  const Layout& lay = c_.layout;
  const auto& params = lay.params();
  std::vector<float> layer;  // the source rank's values of the layer being read, broadcast
  const bool broadcast = source_rank >= 0 && c_.ranks.world > 1;
  const auto before_layer = [&](std::size_t li) {
    const auto& L = lay.layers()[li];
    layer.assign(L.numel, 0.0f);
    if (c_.ranks.rank == source_rank) {
      for (int pi : L.params) read(params[pi].name, 0, params[pi].numel, layer.data() + params[pi].offset);
    }
    c_.ranks.comm->broadcast(layer.data(), layer.size(), DType::fp32, source_rank);
  };
  load_all_or_nothing(
      [&](int pi, int, std::uint64_t elem, std::uint64_t count, float* out) {
        if (broadcast)
          std::copy_n(layer.data() + params[pi].offset + elem, count, out);
        else
          read(params[pi].name, elem, count, out);
      },
      Moments::kept, "write_weights (the weights were kept)", {},
      broadcast ? std::function<void(std::size_t)>(before_layer) : std::function<void(std::size_t)>());
}

}  // namespace strata::engine
