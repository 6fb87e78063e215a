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

// Redirects stderr (fd 2) into a file while alive; text() returns what was written.
class StderrCapture {
 public:
  StderrCapture() : dir_("strata-config-test"), path_(dir_.file("stderr.txt")) {
    std::fflush(stderr);
    saved_ = dup(2);
    std::FILE* f = std::fopen(path_.c_str(), "w");
    dup2(fileno(f), 2);
    std::fclose(f);
  }
  ~StderrCapture() { restore(); }
  std::string text() {
    restore();
    std::ifstream in(path_);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

 private:
  void restore() {
    if (saved_ < 0) return;
    std::fflush(stderr);
    dup2(saved_, 2);
    close(saved_);
    saved_ = -1;
  }
  strata::test::TempDir dir_;
  std::string path_;
  int saved_ = -1;
};

}  // namespace strata::engine::test
