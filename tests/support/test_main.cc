// Catch2 runner for every Strata suite. Tests tagged with hardware ([cuda], [uring]) are
// reported as skipped, never passed or failed, where the hardware is missing: a run asking
// for such a tag exits 77 (ctest's SKIP_RETURN_CODE) printing the reason, and a run with no
// test spec excludes the missing tags and says so (and the tags in $STRATA_TEST_EXCLUDE).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tests/support/skip.h"

int main(int argc, char** argv) {
  bool has_spec = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.empty() || arg[0] == '-') continue;
    has_spec = true;
    for (const char* tag : strata::test::kHardwareTags) {
      const std::string t = std::string("[") + tag + "]";
      const auto pos = arg.find(t);
      if (pos == std::string::npos || (pos > 0 && arg[pos - 1] == '~')) continue;
      const std::string why = strata::test::missing_hardware(tag);
      if (!why.empty()) {
        std::printf("SKIPPED %s tests: %s\n", t.c_str(), why.c_str());
        return 77;
      }
    }
  }
  std::vector<std::string> extra;
  if (!has_spec) {
    std::string exclude = "~[.]";  // an explicit filter would otherwise select hidden tests
    for (const char* tag : strata::test::kHardwareTags) {
      const std::string why = strata::test::missing_hardware(tag);
      if (!why.empty()) {
        std::printf("note: skipping [%s] tests: %s\n", tag, why.c_str());
        exclude += std::string("~[") + tag + "]";
      }
    }
    // STRATA_TEST_EXCLUDE=timing,pku: more tags to leave out (sanitizer passes drop the
    // timing assertions their slowdown breaks).
    if (const char* more = std::getenv("STRATA_TEST_EXCLUDE")) {
      std::string tags = more;
      for (std::size_t at = 0; at < tags.size();) {
        const std::size_t comma = std::min(tags.find(',', at), tags.size());
        if (comma > at) exclude += "~[" + tags.substr(at, comma - at) + "]";
        at = comma + 1;
      }
    }
    extra.push_back(exclude);
  }
  std::vector<char*> args(argv, argv + argc);
  for (auto& e : extra) args.push_back(e.data());
  return Catch::Session().run(static_cast<int>(args.size()), args.data());
}
