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

template <class T> Setter str(T TrainOptions::*field) {
  return [field](TrainOptions& o, const std::string& k, const nlohmann::json& v) { o.*field = text(k, v); };
}
template <class T> Setter model_str(T ModelOptions::*field) {
  return [field](TrainOptions& o, const std::string& k, const nlohmann::json& v) { o.m.*field = text(k, v); };
}
Setter model_int(int ModelOptions::*field, std::int64_t lo, std::int64_t hi) {
  return [=](TrainOptions& o, const std::string& k, const nlohmann::json& v) {
    o.m.*field = static_cast<int>(whole(k, v, lo, hi));
  };
}
Setter ckpt_str(std::string CheckpointFlags::*field) {
  return [field](TrainOptions& o, const std::string& k, const nlohmann::json& v) { o.ckpt.*field = text(k, v); };
}
Setter pipe_int(int PipelineTrainOptions::*field, std::int64_t lo, std::int64_t hi) {
  return [=](TrainOptions& o, const std::string& k, const nlohmann::json& v) {
    o.pipe.*field = static_cast<int>(whole(k, v, lo, hi));
  };
}

// Each key with the flag's range (tools/cli: cmd_train.cc, flags.cc).
const std::map<std::string, Setter>& setters() {
  static const std::map<std::string, Setter> s = {
      {"config", str(&TrainOptions::config)},
      {"steps", [](TrainOptions& o, const std::string& k, const nlohmann::json& v) { o.steps = whole(k, v, 1, kAny); }},
      {"log_json", str(&TrainOptions::log_json)},
      {"save_params", str(&TrainOptions::save_params)},
      {"trace", str(&TrainOptions::trace)},
      {"device", str(&TrainOptions::device)},
      {"device_budget", str(&TrainOptions::device_budget)},
      {"link_gbps",
       [](TrainOptions& o, const std::string& k, const nlohmann::json& v) { o.link_gbps = number(k, v, 0, 1e9); }},
      {"explain", [](TrainOptions& o, const std::string& k, const nlohmann::json& v) { o.explain = flag(k, v); }},
      {"quiet",
       [](TrainOptions& o, const std::string& k, const nlohmann::json& v) {
         if (flag(k, v)) o.printing = StepPrinting::Level::quiet;
       }},
      {"verbose",
       [](TrainOptions& o, const std::string& k, const nlohmann::json& v) {
         if (flag(k, v)) o.printing = StepPrinting::Level::verbose;
       }},
      {"model", model_str(&ModelOptions::model)},
      {"layers", model_int(&ModelOptions::layers, 1, 100000)},
      {"hidden", model_int(&ModelOptions::hidden, 1, 1 << 20)},
      {"layer_ms",
       [](TrainOptions& o, const std::string& k, const nlohmann::json& v) { o.m.layer_ms = number(k, v, 0, 1e9); }},
      {"preset", model_str(&ModelOptions::preset)},
      {"heads", model_int(&ModelOptions::heads, 1, 4096)},
      {"d_model", model_int(&ModelOptions::d_model, 1, 1 << 16)},
      {"seq_len", model_int(&ModelOptions::seq_len, 1, 1 << 20)},
      {"positions", model_int(&ModelOptions::positions, 1, 1 << 20)},
      {"vocab", model_int(&ModelOptions::vocab, 2, 65536)},
      {"remat", model_str(&ModelOptions::remat)},
      {"unit_scaled",
       [](TrainOptions& o, const std::string& k, const nlohmann::json& v) { o.m.unit_scaled = flag(k, v); }},
      {"data", model_str(&ModelOptions::data)},
      {"data_format", model_str(&ModelOptions::data_format)},
      {"tokenizer", model_str(&ModelOptions::tokenizer)},
      {"val_fraction",
       [](TrainOptions& o, const std::string& k, const nlohmann::json& v) { o.m.val_fraction = number(k, v, 0, 1); }},
      {"eval_every", model_int(&ModelOptions::eval_every, 0, kAny >> 33)},
      {"eval_batches", model_int(&ModelOptions::eval_batches, 1, 1 << 20)},
      {"sample", model_int(&ModelOptions::sample, 0, kAny >> 33)},
      {"seed", [](TrainOptions& o, const std::string& k,
                  const nlohmann::json& v) { o.m.seed = static_cast<std::uint64_t>(whole(k, v, 0, kAny)); }},
      {"save_dir", ckpt_str(&CheckpointFlags::save_dir)},
      {"resume", ckpt_str(&CheckpointFlags::resume)},
      {"init_from", ckpt_str(&CheckpointFlags::init_from)},
      {"save_every", [](TrainOptions& o, const std::string& k,
                        const nlohmann::json& v) { o.ckpt.save_every = whole(k, v, 0, kAny); }},
      {"keep", [](TrainOptions& o, const std::string& k,
                  const nlohmann::json& v) { o.ckpt.keep = static_cast<int>(whole(k, v, 0, kAny >> 33)); }},
      {"save_async", [](TrainOptions& o, const std::string& k, const nlohmann::json& v) { o.ckpt.async = flag(k, v); }},
      {"pipeline_stages", pipe_int(&PipelineTrainOptions::stages, 1, 1024)},
      {"schedule",
       [](TrainOptions& o, const std::string& k, const nlohmann::json& v) { o.pipe.schedule = text(k, v); }},
      {"chunks", pipe_int(&PipelineTrainOptions::chunks, 1, 64)},
      {"measure_steps", pipe_int(&PipelineTrainOptions::measure_steps, 1, 1000)},
  };
  return s;
}

std::string known_keys() {
  std::string all;
  for (const auto& [key, set] : setters()) all += (all.empty() ? "" : ", ") + key;
  return all;
}

// "--d-model" -> "d_model".
std::string key_of(const std::string& flag) {
  std::string k = flag.rfind("--", 0) == 0 ? flag.substr(2) : flag;
  for (char& c : k)
    if (c == '-') c = '_';
  return k;
}

}  // namespace

TrainOptions train_options_from_json(const nlohmann::json& j) {
  STRATA_CHECK(j.is_object(), Errc::invalid_argument,
               "training options: a JSON object of option names and values, not ", j.dump());
  TrainOptions o;
  for (const auto& [key, value] : j.items()) {
    const auto it = setters().find(key);
    STRATA_CHECK(it != setters().end(), Errc::invalid_argument, "training option '", key,
                 "' is not one of Strata's (`strata train --help`, with '_' for '-'): ", known_keys());
    it->second(o, key, value);
  }
  STRATA_CHECK(!o.config.empty(), Errc::invalid_argument,
               "training options: 'config' (a DeepSpeed-style JSON file) is required");
  static const char* const kPipelineOnly[] = {"schedule", "chunks", "measure_steps"};
  for (const char* key : kPipelineOnly)
    STRATA_CHECK(!j.contains(key) || o.pipe.stages > 0, Errc::invalid_argument, "training option '", key,
                 "' needs 'pipeline_stages'");
  check_model_options(
      o.m.model, [&](const std::string& flag) { return j.contains(key_of(flag)); },
      [](const std::string& flag) { return "'" + key_of(flag) + "'"; });
  return o;
}

}  // namespace strata::train
