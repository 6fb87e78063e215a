// libFuzzer harness for the config reader (engine/config.h): any bytes are read into an
// EngineConfig or refused with a strata::Error whose message is one line naming the source.
#include "engine/config.h"
#include "fuzz/fuzz_util.h"
#include "runtime/core/error.h"
#include "runtime/core/log.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  strata::set_log_level(strata::LogLevel::error);  // unknown top-level keys and notices would print
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  strata::engine::ModelFacts facts;
  facts.world_size = 2;
  facts.hidden_size = 1024;
  facts.total_steps = 100;
  try {
    strata::engine::parse_config(strata::fuzz::text_of(data, size), "fuzz.json", facts);
  } catch (const strata::Error& e) {
    strata::fuzz::expect_one_line(e.what(), "fuzz.json: ");
  }
  return 0;
}
