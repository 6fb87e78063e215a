// The models `strata train` can train, behind one interface: the demo MLP, the GPT and a
// Llama-family decoder from a Hugging Face directory (--model DIR, llama.h).
// create_train_model() registers the chosen model's parameters with the engine (call it
// before engine.setup()); the loop in trainer.cc then calls step(s) for each step and
// the hooks around it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "models/gpt/config.h"
#include "models/mlp_layers.h"
#include "runtime/core/trace.h"

namespace strata::comm {
class Communicator;
}

namespace strata::train {

struct ModelOptions {
  std::string model = "mlp";
  // MLP
  int layers = 0;  // 0: the model's default (MLP 4; GPT the preset's)
  int hidden = 0;  // 0: 64
  double layer_ms = 0;
  // GPT
  std::string preset;
  int heads = 0, d_model = 0, seq_len = 0, vocab = 0, positions = 0;
  std::string data, data_format = "auto", remat;
  std::string tokenizer;  // decodes --sample (tokenizer.json, tokenizer.model or a directory)
  bool unit_scaled = false;
  double val_fraction = 0.1;
  int eval_every = 0, eval_batches = 8, sample = 0;
  std::uint64_t seed = 0;
};

struct StepOutcome {
  double loss = 0.0;
  engine::StepResult result;
  std::uint64_t tokens = 0;  // tokens (or samples) this step trained on, every rank together
};

class TrainModel {
 public:
  virtual ~TrainModel() = default;
  virtual std::string describe() const = 0;  // one line: model, shape, parameters
  virtual StepOutcome step(std::int64_t s) = 0;
  // Validation loss after step s (1-based) when it is due, else NaN.
  virtual double validate(std::int64_t s, std::int64_t steps) = 0;
  // Printed after training (rank 0): generated text, or nothing.
  virtual std::string finish() = 0;
  // The model's own state beyond the engine's, as JSON text for a checkpoint (empty: none;
  // the GPT's FP8 amax histories and its unit-scaled parametrization), and back:
  // restore_state() gets "" when the checkpoint holds none, and throws naming what does not
  // match.
  virtual std::string state() const { return {}; }
  // Loads the model's own weights after engine.setup() (a Hugging Face directory's); called
  // when the run neither resumes nor has --init-from.
  virtual void load_weights(engine::Engine& /*engine*/) {}
  virtual void restore_state(const std::string& /*json*/) {}
};

// Refuses an option given (given("--heads") says whether it was) that `model` does not read
// (--heads, --data or --sample with the MLP; --hidden or --layer-ms with the GPT; the GPT's
// shape with a Hugging Face directory), naming it as spell(flag) spells it and the model
// that takes it: left unread, it would train or size another model than the one asked for.
// Other model names are the caller's to refuse.
void check_model_options(const std::string& model, const std::function<bool(const std::string& flag)>& given,
                         const std::function<std::string(const std::string& flag)>& spell);

// The GPT's shape and training length from the flags (a preset, then the dimensions given);
// re-materialization from --remat, else `always` when config_remat. Throws
// Errc::invalid_argument naming the flag for a shape that cannot work.
// The MLP the flags describe (--layers 4 and --hidden 64 where not given).
model::MlpConfig mlp_config(const ModelOptions& o);
model::GptConfig gpt_config(const ModelOptions& o, bool config_remat);
// The same, with re-materialization and the FP8 recipe from `config`.
model::GptConfig gpt_config(const ModelOptions& o, const engine::EngineConfig& config);

// Generated tokens as `strata train` prints them: decoded by --tokenizer when given, else
// bytes for a vocabulary of at most 256, else token ids separated by spaces.
std::string sample_text(const std::vector<std::int32_t>& tokens, int vocab, const std::string& tokenizer = "");

// Whether the GPT validates after step s (1-based) of `steps`: every --eval-every steps,
// after the first step when that is set, and after the last (with a held-out part).
bool validation_due(const ModelOptions& o, std::int64_t s, std::int64_t steps);

// The model's hidden size, for the config's "auto" values (MLP --hidden; GPT width, from
// its preset or --d-model).
std::uint64_t model_hidden_size(const ModelOptions& o);

// The config asks for re-materialization (DeepSpeed's activation_checkpointing block).
bool config_remat(const engine::EngineConfig& config);

// The unit-scaled GPT's constants that no tensor shows (the attention score temperature),
// in a checkpoint's trainer state: a checkpoint of the other parametrization holds the same
// tensors and computes another function. record_ writes them when unit_scaled; check_
// throws Errc::invalid_argument, naming the flag to change, when `state` and the run differ.
void record_unit_scaling(nlohmann::json& state, bool unit_scaled);
void check_unit_scaling(const nlohmann::json& state, bool unit_scaled);

// The MLP has no FP8 products: Errc::unsupported naming the key (--unit-scaled, a flag, is
// check_model_flags()'s).
void check_mlp_precision(const engine::EngineConfig& config);
// The same for the Llama family.
void check_no_fp8(const engine::EngineConfig& config);
// What --model takes, for a value that is none of them.
std::string unknown_model(const std::string& model);

// The GPT's FP8 amax histories in a trainer's checkpoint state, and back: the histories the
// state holds, or none for a checkpoint trained without fp8 (then, when `say`, a note that
// scales start afresh).
void record_fp8_history(nlohmann::json& state, const std::vector<std::vector<float>>& histories);
std::optional<std::vector<std::vector<float>>> saved_fp8_history(const nlohmann::json& state, bool say);

// What a model registers and holds on the device, without building it (strata estimate).
struct ModelSize {
  std::vector<engine::ParamSpec> params;
  std::uint64_t device_bytes = 0;      // activations, temporaries and conversion buffers on the device
  std::uint64_t min_device_bytes = 0;  // the smallest device budget the model itself accepts
  std::string describe;
};
// cuda: sized for a CUDA device (the GPT's kernels keep scratch there).
ModelSize model_size(const ModelOptions& o, const engine::EngineConfig& config, bool cuda = false);

// Throws Errc::invalid_argument naming the flag for a bad model option.
std::unique_ptr<TrainModel> create_train_model(const ModelOptions& o, engine::Engine& engine, comm::Communicator* comm,
                                               Tracer* tracer);

}  // namespace strata::train
