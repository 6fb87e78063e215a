// The trainers' options from JSON (see options_json.h).
#include "train/options_json.h"

#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "runtime/core/error.h"

namespace strata::train {
namespace {

using Setter = std::function<void(TrainOptions&, const std::string& key, const nlohmann::json& v)>;

std::string text(const std::string& key, const nlohmann::json& v) {
  STRATA_CHECK(v.is_string(), Errc::invalid_argument, "training option '", key, "' takes a string, not ", v.dump());
  return v.get<std::string>();
}

double number(const std::string& key, const nlohmann::json& v, double lo, double hi) {
  STRATA_CHECK(v.is_number(), Errc::invalid_argument, "training option '", key, "' takes a number, not ", v.dump());
  const double x = v.get<double>();
  STRATA_CHECK(x >= lo && x <= hi, Errc::invalid_argument, "training option '", key, "' is ", v.dump(), ", outside ",
               lo, "..", hi);
  return x;
}

std::int64_t whole(const std::string& key, const nlohmann::json& v, std::int64_t lo, std::int64_t hi) {
  STRATA_CHECK(v.is_number_integer(), Errc::invalid_argument, "training option '", key, "' takes a whole number, not ",
               v.dump());
  const std::int64_t x = v.get<std::int64_t>();
  STRATA_CHECK(x >= lo && x <= hi, Errc::invalid_argument, "training option '", key, "' is ", x, ", outside ", lo, "..",
               hi);
  return x;
}

bool flag(const std::string& key, const nlohmann::json& v) {
  STRATA_CHECK(v.is_boolean(), Errc::invalid_argument, "training option '", key, "' takes true or false, not ",
               v.dump());
  return v.get<bool>();
}

constexpr std::int64_t kAny = std::numeric_limits<std::int64_t>::max();

template <class O> using SetterOf = std::function<void(O&, const std::string& key, const nlohmann::json& v)>;

template <class O, class T> SetterOf<O> str(T O::*field) {
  return [field](O& o, const std::string& k, const nlohmann::json& v) { o.*field = text(k, v); };
}
template <class O> SetterOf<O> integer(int O::*field, std::int64_t lo, std::int64_t hi) {
  return [=](O& o, const std::string& k, const nlohmann::json& v) { o.*field = static_cast<int>(whole(k, v, lo, hi)); };
}
template <class O> SetterOf<O> real(double O::*field, double lo, double hi) {
  return [=](O& o, const std::string& k, const nlohmann::json& v) { o.*field = number(k, v, lo, hi); };
}
template <class O> SetterOf<O> boolean(bool O::*field) {
  return [=](O& o, const std::string& k, const nlohmann::json& v) { o.*field = flag(k, v); };
}
// A setter of a member struct's field (o.*outer's).
template <class O, class I> SetterOf<O> in(I O::*outer, SetterOf<I> set) {
  return [=](O& o, const std::string& k, const nlohmann::json& v) { set(o.*outer, k, v); };
}

// The model's keys: its name and the GPT's shape (the flags of add_model_options).
std::map<std::string, SetterOf<ModelOptions>> shape_setters() {
  using M = ModelOptions;
  return {{"model", str(&M::model)},
          {"layers", integer(&M::layers, 1, 100000)},
          {"hidden", integer(&M::hidden, 1, 1 << 20)},
          {"preset", str(&M::preset)},
          {"heads", integer(&M::heads, 1, 4096)},
          {"d_model", integer(&M::d_model, 1, 1 << 16)},
          {"seq_len", integer(&M::seq_len, 1, 1 << 20)},
          {"positions", integer(&M::positions, 1, 1 << 20)},
          {"vocab", integer(&M::vocab, 2, 65536)},
          {"remat", str(&M::remat)},
          {"unit_scaled", boolean(&M::unit_scaled)}};
}

// Each key with the flag's range (tools/cli: cmd_train.cc, cmd_plan.cc, flags.cc).
const std::map<std::string, SetterOf<TrainOptions>>& train_setters() {
  using T = TrainOptions;
  using M = ModelOptions;
  static const auto s = [] {
    std::map<std::string, SetterOf<T>> all = {
        {"config", str(&T::config)},
        {"steps", [](T& o, const std::string& k, const nlohmann::json& v) { o.steps = whole(k, v, 1, kAny); }},
        {"log_json", str(&T::log_json)},
        {"save_params", str(&T::save_params)},
        {"trace", str(&T::trace)},
        {"device", str(&T::device)},
        {"device_budget", str(&T::device_budget)},
        {"link_gbps", real(&T::link_gbps, 0, 1e9)},
        {"explain", boolean(&T::explain)},
        {"quiet",
         [](T& o, const std::string& k, const nlohmann::json& v) {
           if (flag(k, v)) o.printing = StepPrinting::Level::quiet;
         }},
        {"verbose",
         [](T& o, const std::string& k, const nlohmann::json& v) {
           if (flag(k, v)) o.printing = StepPrinting::Level::verbose;
         }},
        {"layer_ms", in(&T::m, real(&M::layer_ms, 0, 1e9))},
        {"data", in(&T::m, str(&M::data))},
        {"data_format", in(&T::m, str(&M::data_format))},
        {"tokenizer", in(&T::m, str(&M::tokenizer))},
        {"val_fraction", in(&T::m, real(&M::val_fraction, 0, 1))},
        {"eval_every", in(&T::m, integer(&M::eval_every, 0, kAny >> 33))},
        {"eval_batches", in(&T::m, integer(&M::eval_batches, 1, 1 << 20))},
        {"sample", in(&T::m, integer(&M::sample, 0, kAny >> 33))},
        {"seed",
         [](T& o, const std::string& k, const nlohmann::json& v) {
           STRATA_CHECK(v.is_number_unsigned(), Errc::invalid_argument, "training option '", k,
                        "' takes a whole number of at least 0, not ", v.dump());
           o.m.seed = v.get<std::uint64_t>();
         }},
        {"save_dir", in(&T::ckpt, str(&CheckpointFlags::save_dir))},
        {"resume", in(&T::ckpt, str(&CheckpointFlags::resume))},
        {"init_from", in(&T::ckpt, str(&CheckpointFlags::init_from))},
        {"save_every",
         [](T& o, const std::string& k, const nlohmann::json& v) { o.ckpt.save_every = whole(k, v, 0, kAny); }},
        {"keep", in(&T::ckpt, integer(&CheckpointFlags::keep, 0, kAny >> 33))},
        {"save_async", in(&T::ckpt, boolean(&CheckpointFlags::async))},
        {"pipeline_stages", in(&T::pipe, integer(&PipelineTrainOptions::stages, 1, 1024))},
        {"schedule", in(&T::pipe, str(&PipelineTrainOptions::schedule))},
        {"chunks", in(&T::pipe, integer(&PipelineTrainOptions::chunks, 1, 64))},
        {"measure_steps", in(&T::pipe, integer(&PipelineTrainOptions::measure_steps, 1, 1000))},
    };
    for (auto& [key, set] : shape_setters()) all.emplace(key, in(&T::m, set));
    return all;
  }();
  return s;
}

const std::map<std::string, SetterOf<PlanOptions>>& plan_setters() {
  using P = PlanOptions;
  static const auto s = [] {
    std::map<std::string, SetterOf<P>> all = {
        {"budget", str(&P::budget)},
        {"nvme_path", str(&P::nvme_path)},
        {"config", str(&P::config)},
        {"calibration", str(&P::calibration)},
        {"emit_config", str(&P::emit)},
        {"world", integer(&P::world, 1, 1 << 20)},
        {"local_ranks", integer(&P::local_ranks, 1, 1 << 20)},
        {"batch", integer(&P::batch, 1, 1 << 20)},
        {"iters", integer(&P::iters, 1, 100)},
        {"drive_tbw", real(&P::drive_tbw, 1e-9, 1e12)},
    };
    for (auto& [key, set] : shape_setters()) all.emplace(key, in(&P::m, set));
    return all;
  }();
  return s;
}

const std::map<std::string, SetterOf<CalibrateOptions>>& calibrate_setters() {
  using C = CalibrateOptions;
  static const std::map<std::string, SetterOf<C>> all = {
      {"nvme", str(&C::nvme)}, {"out", str(&C::out)}, {"quick", boolean(&C::quick)}, {"strata", str(&C::strata)}};
  return all;
}

template <class O> std::string known_keys(const std::map<std::string, SetterOf<O>>& setters) {
  std::string all;
  for (const auto& [key, set] : setters) all += (all.empty() ? "" : ", ") + key;
  return all;
}

// "--d-model" -> "d_model".
std::string key_of(const std::string& flag) {
  std::string k = flag.rfind("--", 0) == 0 ? flag.substr(2) : flag;
  for (char& c : k)
    if (c == '-') c = '_';
  return k;
}

// Every key of j through its setter (`what`: "training", "plan"), refusing unknown ones.
template <class O>
O apply(const nlohmann::json& j, const char* what, const std::map<std::string, SetterOf<O>>& set, const char* command) {
  STRATA_CHECK(j.is_object(), Errc::invalid_argument, what, " options: a JSON object of option names and values, not ",
               j.dump());
  O o;
  for (const auto& [key, value] : j.items()) {
    const auto it = set.find(key);
    STRATA_CHECK(it != set.end(), Errc::invalid_argument, what, " option '", key, "' is not one of Strata's (`",
                 command, " --help`, with '_' for '-'): ", known_keys(set));
    it->second(o, key, value);
  }
  return o;
}

void check_keys_for_model(const nlohmann::json& j, const std::string& model) {
  check_model_options(
      model, [&](const std::string& flag) { return j.contains(key_of(flag)); },
      [](const std::string& flag) { return "'" + key_of(flag) + "'"; });
}

}  // namespace

TrainOptions train_options_from_json(const nlohmann::json& j) {
  TrainOptions o = apply(j, "training", train_setters(), "strata train");
  STRATA_CHECK(!o.config.empty(), Errc::invalid_argument,
               "training options: 'config' (a DeepSpeed-style JSON file) is required");
  STRATA_CHECK(!(j.value("quiet", false) && j.value("verbose", false)), Errc::invalid_argument,
               "training options 'quiet' and 'verbose' exclude each other: give one");
  static const char* const kPipelineOnly[] = {"schedule", "chunks", "measure_steps"};
  for (const char* key : kPipelineOnly)
    STRATA_CHECK(!j.contains(key) || o.pipe.stages > 0, Errc::invalid_argument, "training option '", key,
                 "' needs 'pipeline_stages'");
  check_keys_for_model(j, o.m.model);
  return o;
}

PlanOptions plan_options_from_json(const nlohmann::json& j) {
  PlanOptions o = apply(j, "plan", plan_setters(), "strata plan");
  STRATA_CHECK(!o.budget.empty(), Errc::invalid_argument,
               "plan options: 'budget' (device=BYTES,host=BYTES[,nvme=BYTES]) is required");
  check_keys_for_model(j, o.m.model);
  return o;
}

CalibrateOptions calibrate_options_from_json(const nlohmann::json& j) {
  CalibrateOptions o = apply(j, "calibration", calibrate_setters(), "strata bench calibrate");
  STRATA_CHECK(!o.nvme.empty(), Errc::invalid_argument,
               "calibration options: 'nvme' (a directory on the NVMe device) is required");
  return o;
}

}  // namespace strata::train
