// strata_train and strata_plan (see c_train.h): the JSON options parsed, then the trainer or
// the plan, inside the C API's error boundary.
#include "train/c_train.h"

#include <dlfcn.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "engine/c_guard.h"
#include "train/calibrate.h"
#include "train/options_json.h"
#include "train/pass_profile.h"
#include "train/plan.h"
#include "train/trainer.h"

namespace {

nlohmann::json parsed(const char* options_json, const char* who) {
  STRATA_CHECK(options_json != nullptr, strata::Errc::invalid_argument, who, ": options_json is null");
  try {
    return nlohmann::json::parse(options_json);
  } catch (const nlohmann::json::parse_error& e) {
    STRATA_THROW(strata::Errc::invalid_argument, who, ": the options are not JSON (", e.what(), ")");
  }
}

// bin/strata beside the lib/ this library was loaded from (a build tree's layout).
std::string strata_beside_library() {
  Dl_info info{};
  STRATA_CHECK(
      ::dladdr(reinterpret_cast<void*>(&strata_calibrate), &info) != 0 && info.dli_fname != nullptr,
      strata::Errc::invalid_argument,
      "strata_calibrate: cannot tell where libstrata_c is loaded from: give \"strata\", the strata executable");
  std::error_code ec;  // the library's own path, links resolved (a failure leaves it as given)
  auto lib = std::filesystem::weakly_canonical(info.dli_fname, ec);
  if (ec) lib = info.dli_fname;
  const auto exe = lib.parent_path().parent_path() / "bin" / "strata";
  STRATA_CHECK(std::filesystem::exists(exe), strata::Errc::invalid_argument,
               "strata_calibrate: no strata executable at ", exe.string(), " (beside ", info.dli_fname,
               "): give \"strata\", the path of one");
  return exe.string();
}

}  // namespace

extern "C" strata_status strata_train(const char* options_json) {
  return strata::capi::guarded([&] {
    const auto o = strata::train::train_options_from_json(parsed(options_json, "strata_train"));
    // The trainer handles SIGINT/SIGTERM/SIGHUP for the process while it runs (train/interrupt.h):
    // two at once would restore each other's handlers.
    static std::atomic<bool> running{false};
    STRATA_CHECK(!running.exchange(true), strata::Errc::invalid_argument,
                 "strata_train: another strata_train runs in this process; run one at a time (or one per process, "
                 "as strata launch does)");
    struct Done {
      ~Done() { running = false; }
    } done;
    strata::train::run_training(o);
  });
}

extern "C" strata_status strata_plan(const char* options_json, char** result_json) {
  return strata::capi::guarded([&] {
    STRATA_CHECK(result_json != nullptr, strata::Errc::invalid_argument, "strata_plan: result_json is null");
    *result_json = nullptr;
    const auto o = strata::train::plan_options_from_json(parsed(options_json, "strata_plan"));
    const auto plan = strata::train::make_plan(o, [&](int micro, const std::string& remat, const std::string& p) {
      return strata::train::profile_pass(o.m, micro, remat, p, o.iters);
    });
    const std::string text = plan.json(static_cast<int>(plan.fit.size())).dump();
    char* out = static_cast<char*>(std::malloc(text.size() + 1));
    STRATA_CHECK(out != nullptr, strata::Errc::out_of_budget, "strata_plan: no memory for its ", text.size(),
                 " bytes of JSON");
    std::memcpy(out, text.c_str(), text.size() + 1);
    *result_json = out;
  });
}

extern "C" strata_status strata_calibrate(const char* options_json) {
  return strata::capi::guarded([&] {
    auto o = strata::train::calibrate_options_from_json(parsed(options_json, "strata_calibrate"));
    if (o.strata.empty()) o.strata = strata_beside_library();
    strata::train::calibrate(o, [](const char*) {});
  });
}

extern "C" void strata_free_text(char* text) { std::free(text); }
