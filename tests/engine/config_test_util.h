// Shared pieces of the config tests: parse with chosen ModelFacts, the message of the
// error a parse throws, and stderr capture for the one notice line.
#pragma once

#include <catch2/catch.hpp>

#include <unistd.h>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "engine/config.h"
#include "runtime/core/error.h"
#include "tests/support/stderr_capture.h"
#include "tests/support/temp_dir.h"

namespace strata::engine::test {

inline ModelFacts facts(int world_size = 1, std::uint64_t hidden_size = 0) {
  ModelFacts f;
  f.world_size = world_size;
  f.hidden_size = hidden_size;
  return f;
}

inline EngineConfig parse(const std::string& text, const ModelFacts& f = facts()) {
  return parse_config(text, "ds_config.json", f);
}

// `body` inside a config that already has a batch size, for tests about other keys.
inline std::string with_batch(const std::string& body) {
  return "{\"train_micro_batch_size_per_gpu\": 1" + (body.empty() ? std::string() : ", " + body) + "}";
}

// The message of the invalid_argument error that parsing `text` throws.
inline std::string error_of(const std::string& text, const ModelFacts& f = facts()) {
  try {
    parse(text, f);
  } catch (const Error& e) {
    CHECK(e.code() == Errc::invalid_argument);
    return e.what();
  }
  return "no error";
}

using strata::test::StderrCapture;

}  // namespace strata::engine::test
