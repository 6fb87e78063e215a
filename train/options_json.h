// The plain and pipelined trainers' options as one JSON object, for callers without a command
// line (the C API's strata_train, python's strata.train): each key is a `strata train` flag's
// long name without its dashes and with '_' for '-' ("d_model" for --d-model, "save_dir" for
// --save-dir), with that flag's meaning, range and default; "quiet" and "verbose" are
// booleans. "config" is required, as on the command line.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include "train/trainer.h"

namespace strata::train {

// Throws Errc::invalid_argument naming the key: not an object, an unknown key (the known ones
// listed), a value of the wrong type or out of the flag's range, "config" missing, or a key
// the chosen model does not read (check_model_options).
TrainOptions train_options_from_json(const nlohmann::json& j);

}  // namespace strata::train
