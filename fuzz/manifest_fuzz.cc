// libFuzzer harness for the checkpoint manifest (checkpoint/format.h): parsed whole and as
// one rank's part; a manifest that parses must survive its own JSON form.
#include "checkpoint/format.h"
#include "fuzz/fuzz_util.h"
#include "runtime/core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace strata::checkpoint;
  const std::string text = strata::fuzz::text_of(data, size);
  for (bool partial : {false, true}) {
    Manifest m;
    try {
      m = parse_manifest(text, "fuzz.json", partial);
    } catch (const strata::Error&) {
      continue;  // refused: the only way out besides a manifest
    }
    try {
      const std::string again = to_json(m);
      strata::fuzz::expect(to_json(parse_manifest(again, "fuzz.json", partial)) == again,
                           "a manifest's JSON form does not parse back to itself");
    } catch (const strata::Error&) {
      strata::fuzz::expect(false, "a parsed manifest's own JSON form is refused");
    }
  }
  return 0;
}
