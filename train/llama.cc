// The Llama family behind TrainModel (see llama.h).
#include "train/llama.h"

#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "models/gpt/data.h"
#include "models/hf/model_dir.h"
#include "runtime/core/error.h"
#include "runtime/core/units.h"

namespace strata::train {
namespace {

model::LlamaShape read_shape(const std::string& dir, bool say) {
  model::HfModelDir hf(dir);
  auto s = model::parse_hf_config(hf.config(), dir + "/config.json");
  if (say && !s.unread_keys.empty()) {
    std::string keys;
    for (const auto& k : s.unread_keys) keys += (keys.empty() ? "" : ", ") + k;
    std::printf("note: %s/config.json: keys not read (outside the %s architecture): %s\n", dir.c_str(),
                s.model_type.c_str(), keys.c_str());
  }
  return s;
}

// Tensors Hugging Face checkpoints may carry that the model does not use: a tied head's copy of
// the embedding and the rotary inverse frequencies older Llama checkpoints saved.
bool tolerated_extra(const model::LlamaShape& s, const std::string& name) {
  const std::string inv = "rotary_emb.inv_freq";
  return (s.tied && name == "lm_head.weight") ||
         (name.size() > inv.size() && name.compare(name.size() - inv.size(), inv.size(), inv) == 0);
}

class LlamaModel : public TrainModel {
 public:
  LlamaModel(const ModelOptions& o, engine::Engine& engine, comm::Communicator* comm, Tracer* tracer)
      : o_(o),
        engine_(engine),
        hf_(o.model),
        cfg_(llama_config(o, config_remat(engine.config()))),
        data_(model::TokenData::load(o.data, cfg_.shape.vocab, o.data_format, engine.rank() != 0)),
        batcher_(data_, o.data, cfg_.seq_len, o.val_fraction, o.seed),
        llama_(engine, cfg_, batcher_, comm, tracer) {
    STRATA_CHECK(o.eval_every == 0 || o.val_fraction > 0, Errc::invalid_argument,
                 "--eval-every needs a validation split: set --val-fraction > 0");
    if (engine.rank() == 0) read_shape(o.model, true);
  }

  std::string describe() const override {
    return str_cat(model::describe(cfg_.shape), " from ", o_.model, ", seq ", cfg_.seq_len, ", remat ",
                   model::remat_name(cfg_.remat), ", activations ", format_bytes(llama_.activation_bytes()), ", data ",
                   data_.description());
  }

  void load_weights(engine::Engine& engine) override {
    if (!hf_.has_weights()) {
      if (engine.rank() == 0)
        std::printf("%s has config.json alone: starting from Hugging Face's initialisation (normal(0, %g), norms 1)\n",
                    o_.model.c_str(), cfg_.shape.initializer_range);
      return;
    }
    model::hf::WantedTensors wanted;
    for (const auto& p : model::llama_params(cfg_.shape)) wanted.emplace_back(p.name, p.shape);
    std::size_t skipped = 0;
    for (const auto& t : hf_.tensors()) {
      if (!tolerated_extra(cfg_.shape, t.name)) continue;
      wanted.emplace_back(t.name, t.shape);
      ++skipped;
    }
    hf_.check(wanted);
    const auto t0 = std::chrono::steady_clock::now();
    engine.init_weights([&](const std::string& name, std::uint64_t elem, std::uint64_t count, float* out) {
      hf_.read(name, elem, count, out);
      for (std::uint64_t i = 0; i < count; ++i) {
        STRATA_CHECK(std::isfinite(out[i]), Errc::invalid_argument, "'", o_.model, "': tensor '", name, "' holds ",
                     out[i], " at element ", elem + i,
                     ": training cannot start from non-finite weights; fix or re-export the checkpoint");
      }
    });
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (engine.rank() == 0) {
      std::printf(
          "loaded %zu tensors from %s (%zu shard file%s): rank 0 read %s in %.2f s (each range twice: checked, "
          "then loaded)%s\n",
          model::llama_params(cfg_.shape).size(), o_.model.c_str(), hf_.shard_files().size(),
          hf_.shard_files().size() == 1 ? "" : "s", format_bytes(hf_.bytes_read()).c_str(), secs,
          skipped > 0 ? str_cat(" (", skipped, " unused tensors skipped: a tied head's copy, rotary tables)").c_str()
                      : "");
    }
  }

  StepOutcome step(std::int64_t s) override {
    const auto r = llama_.train_step(s);
    return {r.loss, r.result, static_cast<std::uint64_t>(engine_.config().train_batch_size) * cfg_.seq_len};
  }
  double validate(std::int64_t s, std::int64_t steps) override {
    return validation_due(o_, s, steps) ? llama_.evaluate(o_.eval_batches) : NAN;
  }
  std::string state() const override { return nlohmann::json{{"hf_config", hf_.config()}}.dump(); }
  void restore_state(const std::string& text) override { check_llama_state(text, cfg_.shape, o_.model); }
  std::string finish() override {
    if (o_.sample <= 0) return {};
    const std::vector<std::int32_t> prompt{static_cast<std::int32_t>(data_[0])};
    return sample_text(llama_.sample(prompt, o_.sample, 0.8f, o_.seed ^ 0x73616d706c65ull), cfg_.shape.vocab,
                       o_.tokenizer);
  }

 private:
  ModelOptions o_;
  engine::Engine& engine_;
  model::HfModelDir hf_;
  model::LlamaConfig cfg_;
  model::TokenData data_;
  model::Batcher batcher_;
  model::Llama llama_;
};

}  // namespace

void check_llama_state(const std::string& text, const model::LlamaShape& shape, const std::string& dir) {
  const auto j = text.empty() ? nlohmann::json::object() : nlohmann::json::parse(text);
  STRATA_CHECK(j.contains("hf_config"), Errc::invalid_argument,
               "the checkpoint holds no Hugging Face config: it was not trained with --model DIR; resume it with "
               "the model it was trained with");
  const auto saved = model::parse_hf_config(j.at("hf_config"), "the checkpoint's hf_config");
  const auto a = model::llama_params(saved), b = model::llama_params(shape);
  bool same = a.size() == b.size() && saved.rms_eps == shape.rms_eps &&
              model::rope_inv_freq(saved) == model::rope_inv_freq(shape);
  for (std::size_t i = 0; same && i < a.size(); ++i) same = a[i].name == b[i].name && a[i].shape == b[i].shape;
  STRATA_CHECK(same, Errc::invalid_argument, "the checkpoint's model (", model::describe(saved),
               ") is not the one --model ", dir, " describes (", model::describe(shape),
               "): resume with the model directory it was trained from");
}

bool is_hf_model_dir(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && ::stat((path + "/config.json").c_str(), &st) == 0;
}

model::LlamaConfig llama_config(const ModelOptions& o, bool config_remat) {
  model::LlamaConfig c;
  c.shape = read_shape(o.model, false);
  c.seq_len = o.seq_len > 0 ? o.seq_len : std::min(c.shape.max_positions, 2048);
  c.remat = o.remat.empty() ? (config_remat ? model::Remat::always : model::Remat::never) : model::parse_remat(o.remat);
  model::validate_seq_len(c.shape, c.seq_len);
  return c;
}

ModelSize llama_model_size(const ModelOptions& o, const engine::EngineConfig& config, bool cuda) {
  const model::LlamaConfig c = llama_config(o, config_remat(config));
  ModelSize out;
  for (const auto& p : model::llama_params(c.shape)) {
    engine::ParamSpec s;
    s.name = p.name;
    s.shape = p.shape;
    s.layer = p.layer;
    s.init = p.init;
    out.params.push_back(std::move(s));
  }
  const int micro = static_cast<int>(config.train_micro_batch_size_per_gpu);
  out.device_bytes = model::Llama::activation_bytes(c, micro, engine::compute_dtype_of(config), cuda);
  out.min_device_bytes = model::Llama::min_device_bytes(c, micro, engine::compute_dtype_of(config), cuda);
  out.describe = str_cat(model::describe(c.shape), ", seq ", c.seq_len, ", remat ", model::remat_name(c.remat));
  return out;
}

std::unique_ptr<TrainModel> create_llama_model(const ModelOptions& o, engine::Engine& engine, comm::Communicator* comm,
                                               Tracer* tracer) {
  STRATA_CHECK(!o.data.empty(), Errc::invalid_argument, "--model ", o.model,
               " needs --data PATH: a token file in the model's vocabulary (strata tokenize writes one)");
  return std::make_unique<LlamaModel>(o, engine, comm, tracer);
}

}  // namespace strata::train
