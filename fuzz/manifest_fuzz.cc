// libFuzzer harness for the checkpoint manifest (checkpoint/format.h): the manifest file as
// open_checkpoint reads it (checksum, then the whole manifest), and the JSON parsed whole
// and as one rank's part (which a mutated checksum would otherwise keep the fuzzer from);
// whatever is accepted must survive its own written form.
#include "checkpoint/format.h"
#include "fuzz/fuzz_util.h"
#include "runtime/core/error.h"
#include "runtime/core/log.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace strata::checkpoint;
  static const bool quiet = [] {  // a version-1 file's warning on every input is noise
    strata::set_log_level(strata::LogLevel::error);
    return true;
  }();
  (void)quiet;
  const std::string text = strata::fuzz::text_of(data, size);
  try {
    const Manifest m = parse_manifest_file(text, "fuzz/manifest.json");
    const std::string file = manifest_file_text(m);
    try {
      strata::fuzz::expect(manifest_file_text(parse_manifest_file(file, "fuzz/manifest.json")) == file,
                           "a manifest file's written form does not read back to itself");
    } catch (const strata::Error&) {
      strata::fuzz::expect(false, "a manifest file's own written form is refused");
    }
  } catch (const strata::Error&) {
    // refused: the only way out besides a manifest
  }
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
