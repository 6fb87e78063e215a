// strata_train (see c_train.h): the JSON options parsed, then the trainer, inside the C API's
// error boundary.
#include "train/c_train.h"

#include <nlohmann/json.hpp>

#include "engine/c_guard.h"
#include "train/options_json.h"
#include "train/trainer.h"

extern "C" strata_status strata_train(const char* options_json) {
  return strata::capi::guarded([&] {
    STRATA_CHECK(options_json != nullptr, strata::Errc::invalid_argument, "strata_train: options_json is null");
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(options_json);
    } catch (const nlohmann::json::parse_error& e) {
      STRATA_THROW(strata::Errc::invalid_argument, "strata_train: the options are not JSON (", e.what(), ")");
    }
    strata::train::run_training(strata::train::train_options_from_json(j));
  });
}
