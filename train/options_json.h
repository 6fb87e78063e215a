// The trainers' and the plan's options as one JSON object, for callers without a command line
// (the C API's strata_train and strata_plan, python's strata.train and strata.plan): each key
// is a `strata train` (`strata plan`) flag's long name without its dashes and with '_' for '-'
// ("d_model" for --d-model, "save_dir" for --save-dir, "emit_config" for --emit-config), with
// that flag's meaning, range and default; "quiet", "verbose" and the like are booleans.
// "config" is required for training and "budget" for the plan, as on the command line.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include "train/calibrate.h"
#include "train/plan.h"
#include "train/trainer.h"

namespace strata::train {

// Throws Errc::invalid_argument naming the key: not an object, an unknown key (the known ones
// listed), a value of the wrong type or out of the flag's range, "config" missing, or a key
// the chosen model does not read (check_model_options).
TrainOptions train_options_from_json(const nlohmann::json& j);
// The same for the plan (no "budget" refused too).
PlanOptions plan_options_from_json(const nlohmann::json& j);
// `strata bench calibrate`'s: "nvme" (required), "out", "quick", and "strata" (the executable).
CalibrateOptions calibrate_options_from_json(const nlohmann::json& j);

}  // namespace strata::train
