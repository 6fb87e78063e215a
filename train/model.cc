// The MLP and the GPT behind TrainModel (see model.h): options and the GPT's data,
// validation and sample.
#include "train/model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "models/gpt/data.h"
#include "models/gpt/gpt.h"
#include "models/gpt/unit_scale.h"
#include "models/mlp.h"
#include "runtime/core/error.h"
#include "runtime/core/units.h"
#include "tokenizer/tokenizer.h"
#include "train/llama.h"

namespace strata::train {
namespace {

class MlpModel : public TrainModel {
 public:
  MlpModel(const ModelOptions& o, engine::Engine& engine, comm::Communicator* comm, Tracer* tracer)
      : engine_(engine), cfg_(mlp_config(o)), mlp_(engine, cfg_, comm, tracer) {}
  std::string describe() const override {
    return str_cat("mlp ", cfg_.layers, " x ", cfg_.hidden, " (", mlp_.parameter_count(), " parameters)");
  }
  StepOutcome step(std::int64_t s) override {
    const auto r = mlp_.train_step(s);
    return {r.loss, r.result, static_cast<std::uint64_t>(engine_.config().train_batch_size)};
  }
  double validate(std::int64_t, std::int64_t) override { return NAN; }
  std::string finish() override { return {}; }

 private:
  engine::Engine& engine_;
  model::MlpConfig cfg_;
  model::Mlp mlp_;
};

}  // namespace

model::GptConfig gpt_config(const ModelOptions& o, bool config_remat) {
  model::GptConfig c;
  if (!o.preset.empty()) c.shape = model::gpt_preset(o.preset);
  auto set = [](int v, int& field) {
    if (v > 0) field = v;
  };
  set(o.layers, c.shape.layers);
  set(o.heads, c.shape.heads);
  set(o.d_model, c.shape.d_model);
  set(o.vocab, c.shape.vocab);
  c.seq_len = o.seq_len > 0 ? o.seq_len : c.shape.positions;
  // Without a preset or --positions the position table is as long as the sequence.
  if (o.positions > 0)
    c.shape.positions = o.positions;
  else if (o.preset.empty() && o.seq_len > 0)
    c.shape.positions = o.seq_len;
  c.remat = o.remat.empty() ? (config_remat ? model::Remat::always : model::Remat::never) : model::parse_remat(o.remat);
  c.seed = o.seed;
  c.unit_scaled = o.unit_scaled;
  model::validate(c);
  return c;
}

model::GptConfig gpt_config(const ModelOptions& o, const engine::EngineConfig& config) {
  model::GptConfig c = gpt_config(o, config_remat(config));
  c.fp8 = model::Gpt::fp8_recipe(config.fp8);
  return c;
}

std::uint64_t model_hidden_size(const ModelOptions& o) {
  if (is_hf_model_dir(o.model)) return static_cast<std::uint64_t>(llama_config(o, false).shape.hidden);
  if (o.model == "gpt") return static_cast<std::uint64_t>(gpt_config(o, false).shape.d_model);
  return static_cast<std::uint64_t>(mlp_config(o).hidden);
}

std::string sample_text(const std::vector<std::int32_t>& tokens, int vocab, const std::string& tokenizer) {
  if (!tokenizer.empty()) {
    const auto t = tokenizer::Tokenizer::open(tokenizer);
    return t->decode(std::vector<std::uint32_t>(tokens.begin(), tokens.end()));
  }
  std::string text;
  for (auto t : tokens) {
    if (vocab <= 256)
      text.push_back(static_cast<char>(t));
    else
      text += str_cat(t, " ");
  }
  return text;
}

bool validation_due(const ModelOptions& o, std::int64_t s, std::int64_t steps) {
  if (o.val_fraction <= 0) return false;
  return (o.eval_every > 0 && s % o.eval_every == 0) || s == steps || (s == 1 && o.eval_every > 0);
}

void check_model_options(const std::string& model, const std::function<bool(const std::string& flag)>& given,
                         const std::function<std::string(const std::string& flag)>& spell) {
  static const char* const kGptOnly[] = {"--preset",       "--heads",       "--d-model",      "--seq-len",
                                         "--positions",    "--vocab",       "--remat",        "--unit-scaled",
                                         "--data",         "--data-format", "--val-fraction", "--eval-every",
                                         "--eval-batches", "--sample",      "--tokenizer"};
  static const char* const kMlpOnly[] = {"--hidden", "--layer-ms"};
  const auto refuse = [&](const auto& flags, const char* owner) {
    for (const char* flag : flags) {
      const std::string f = spell(flag), m = spell("--model");
      STRATA_CHECK(!given(flag), Errc::invalid_argument, f, " applies to ", m, " ", owner,
                   " only, and this run's model is ", model, ": drop ", f, ", or give ", m, " ", owner);
    }
  };
  if (model == "mlp") refuse(kGptOnly, "gpt");
  if (model == "gpt") refuse(kMlpOnly, "mlp");
  if (model != "mlp" && model != "gpt") {
    // A Hugging Face directory: its config.json is the shape.
    static const char* const kShape[] = {"--preset", "--heads",  "--d-model",    "--positions",
                                         "--vocab",  "--layers", "--unit-scaled"};
    for (const char* flag : kShape) {
      const std::string f = spell(flag);
      STRATA_CHECK(!given(flag), Errc::invalid_argument, f, " sets the GPT's shape, and ", spell("--model"), " ", model,
                   "'s shape comes from its config.json: drop ", f);
    }
    refuse(kMlpOnly, "mlp");
  }
}

model::MlpConfig mlp_config(const ModelOptions& o) {
  return {o.layers > 0 ? o.layers : 4, o.hidden > 0 ? o.hidden : 64, o.layer_ms, o.seed};
}

void record_unit_scaling(nlohmann::json& state, bool unit_scaled) {
  if (unit_scaled) state["unit_scaled"] = {{"score_temperature", model::UnitScales::kScoreTemperature}};
}

std::string unknown_model(const std::string& model) {
  return str_cat("use mlp, gpt, or a Hugging Face model directory (one holding config.json",
                 model.find('/') != std::string::npos ? ": '" + model + "' is not one" : "", ")");
}

void check_no_fp8(const engine::EngineConfig& config) {
  STRATA_CHECK(!config.fp8.enabled, Errc::unsupported,
               "fp8.enabled: FP8 matrix products are implemented for the GPT (--model gpt), not the Llama family: set "
               "fp8.enabled to false");
}

void check_mlp_precision(const engine::EngineConfig& config) {
  STRATA_CHECK(!config.fp8.enabled, Errc::unsupported,
               "fp8.enabled: FP8 matrix products are implemented for the GPT (--model gpt), not the MLP: set "
               "fp8.enabled to false or use --model gpt");
}

void record_fp8_history(nlohmann::json& state, const std::vector<std::vector<float>>& histories) {
  state["fp8_amax_history"] = histories;
}

std::optional<std::vector<std::vector<float>>> saved_fp8_history(const nlohmann::json& state, bool say) {
  if (!state.contains("fp8_amax_history")) {
    if (say) std::printf("note: the checkpoint holds no FP8 amax history (trained without fp8): scales start afresh\n");
    return std::nullopt;
  }
  try {
    return state.at("fp8_amax_history").get<std::vector<std::vector<float>>>();
  } catch (const nlohmann::json::exception& e) {
    STRATA_THROW(Errc::corrupt, "the checkpoint's fp8_amax_history is not a list of amax lists (", e.what(),
                 "): the trainer state is damaged; resume from another checkpoint");
  }
}

void check_unit_scaling(const nlohmann::json& state, bool unit_scaled) {
  STRATA_CHECK(unit_scaled || !state.contains("unit_scaled"), Errc::invalid_argument,
               "the checkpoint's GPT is unit-scaled and this run's is not: the same tensors compute another "
               "function; add --unit-scaled");
  if (unit_scaled) {
    STRATA_CHECK(state.contains("unit_scaled"), Errc::invalid_argument,
                 "the checkpoint records no unit-scaled parametrization: its GPT was trained without "
                 "--unit-scaled, or unit-scaled before the attention score temperature (",
                 model::UnitScales::kScoreTemperature,
                 ") was fixed; either way its weights belong to another function: drop --unit-scaled for the "
                 "first, start afresh (no --resume) for the second");
    const float t = state.at("unit_scaled").at("score_temperature").get<float>();
    STRATA_CHECK(t == model::UnitScales::kScoreTemperature, Errc::invalid_argument,
                 "the checkpoint's unit-scaled GPT has attention score temperature ", t, " and this build's has ",
                 model::UnitScales::kScoreTemperature,
                 ": another function of the same weights; resume with the build that wrote it, or start afresh");
  }
}

bool config_remat(const engine::EngineConfig& config) {
  const auto& ignored = config.ignored_keys;
  return std::find(ignored.begin(), ignored.end(), "activation_checkpointing") != ignored.end();
}

ModelSize model_size(const ModelOptions& o, const engine::EngineConfig& config, bool cuda) {
  ModelSize out;
  if (o.model == "mlp") {
    const model::MlpConfig m = mlp_config(o);
    out.params = model::mlp_param_specs(m);
    out.describe = str_cat("mlp ", m.layers, " x ", m.hidden);
    return out;  // its activations live in host memory on the host device
  }
  if (is_hf_model_dir(o.model)) {
    check_no_fp8(config);
    return llama_model_size(o, config, cuda);
  }
  STRATA_CHECK(o.model == "gpt", Errc::invalid_argument, "--model ", o.model,
               " is not available: ", unknown_model(o.model));
  const model::GptConfig c = gpt_config(o, config);
  for (const auto& p : model::gpt_params(c.shape, c.unit_scaled, c.seq_len)) {
    engine::ParamSpec s;
    s.name = p.name;
    s.shape = p.shape;
    s.layer = p.layer;
    s.init = p.init;
    s.lr_scale = p.lr_scale;
    out.params.push_back(std::move(s));
  }
  out.device_bytes = model::Gpt::activation_bytes(c, static_cast<int>(config.train_micro_batch_size_per_gpu),
                                                  engine::compute_dtype_of(config), cuda);
  out.min_device_bytes = model::Gpt::min_device_bytes(c, static_cast<int>(config.train_micro_batch_size_per_gpu),
                                                      engine::compute_dtype_of(config), cuda);
  const auto& s = c.shape;
  out.describe = str_cat("gpt ", s.layers, " layers x ", s.d_model, " (", s.heads, " heads, vocab ", s.vocab, ", seq ",
                         c.seq_len, ", remat ", model::remat_name(c.remat), c.unit_scaled ? ", unit-scaled" : "", ")");
  return out;
}

namespace {

class GptModel : public TrainModel {
 public:
  GptModel(const ModelOptions& o, engine::Engine& engine, comm::Communicator* comm, Tracer* tracer)
      : o_(o),
        engine_(engine),
        cfg_(gpt_config(o, engine.config())),
        data_(model::TokenData::load(o.data, cfg_.shape.vocab, o.data_format, engine.rank() != 0)),
        batcher_(data_, o.data, cfg_.seq_len, o.val_fraction, o.seed),
        gpt_(engine, cfg_, batcher_, comm, tracer) {
    STRATA_CHECK(o.eval_every == 0 || o.val_fraction > 0, Errc::invalid_argument,
                 "--eval-every needs a validation split: set --val-fraction > 0");
  }
  std::string describe() const override {
    const auto& s = cfg_.shape;
    return str_cat("gpt ", s.layers, " layers x ", s.d_model, " (", s.heads, " heads, vocab ", s.vocab, ", seq ",
                   cfg_.seq_len, ", remat ", model::remat_name(cfg_.remat), cfg_.unit_scaled ? ", unit-scaled" : "",
                   "; ", gpt_.parameter_count(), " parameters, activations ", format_bytes(gpt_.activation_bytes()),
                   "), data ", data_.description());
  }
  StepOutcome step(std::int64_t s) override {
    const auto r = gpt_.train_step(s);
    return {r.loss, r.result, static_cast<std::uint64_t>(engine_.config().train_batch_size) * cfg_.seq_len};
  }
  double validate(std::int64_t s, std::int64_t steps) override {
    return validation_due(o_, s, steps) ? gpt_.evaluate(o_.eval_batches) : NAN;
  }
  // The unit-scaled parametrization's constants that no tensor shows (the attention score
  // temperature): a checkpoint of another parametrization has the same tensors and is
  // another function.
  std::string state() const override {
    auto j = nlohmann::json::object();
    if (gpt_.fp8_enabled()) record_fp8_history(j, gpt_.fp8_state());
    record_unit_scaling(j, cfg_.unit_scaled);
    return j.empty() ? std::string() : j.dump();
  }
  void restore_state(const std::string& text) override {
    const auto j = text.empty() ? nlohmann::json::object() : nlohmann::json::parse(text);
    check_unit_scaling(j, cfg_.unit_scaled);
    if (!gpt_.fp8_enabled()) return;
    if (auto h = saved_fp8_history(j, engine_.rank() == 0)) gpt_.restore_fp8_state(*h);
  }
  std::string finish() override {
    if (o_.sample <= 0) return {};
    return sample_text(gpt_.sample({'\n'}, o_.sample, 0.8f, o_.seed ^ 0x73616d706c65ull), cfg_.shape.vocab,
                       o_.tokenizer);
  }

 private:
  ModelOptions o_;
  engine::Engine& engine_;
  model::GptConfig cfg_;
  model::TokenData data_;
  model::Batcher batcher_;
  model::Gpt gpt_;
};

}  // namespace

std::unique_ptr<TrainModel> create_train_model(const ModelOptions& o, engine::Engine& engine, comm::Communicator* comm,
                                               Tracer* tracer) {
  if (o.model == "mlp") {
    check_mlp_precision(engine.config());
    return std::make_unique<MlpModel>(o, engine, comm, tracer);
  }
  if (o.model == "gpt") {
    STRATA_CHECK(!o.data.empty(), Errc::invalid_argument,
                 "--model gpt needs --data PATH: a text file, a directory of them, or a token file");
    return std::make_unique<GptModel>(o, engine, comm, tracer);
  }
  if (is_hf_model_dir(o.model)) {
    check_no_fp8(engine.config());
    return create_llama_model(o, engine, comm, tracer);
  }
  STRATA_THROW(Errc::invalid_argument, "--model ", o.model, " is not available: ", unknown_model(o.model));
}

}  // namespace strata::train
