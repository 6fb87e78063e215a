// libFuzzer harness for the schedule text and CSV forms (pipeline/schedule.h): parse, then
// validate; a schedule that parses must print and parse back to the same text.
#include "fuzz/fuzz_util.h"
#include "pipeline/schedule.h"
#include "pipeline/simulate.h"
#include "runtime/core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace strata::pipeline;
  Schedule s;
  try {
    s = parse_schedule(strata::fuzz::text_of(data, size));
  } catch (const strata::Error&) {
    return 0;  // refused: the only way out besides a schedule
  }
  validate(s);
  const std::string text = to_text(s);
  try {
    strata::fuzz::expect(to_text(parse_schedule(text)) == text, "to_text(parse_schedule(to_text(s))) != to_text(s)");
    strata::fuzz::expect(to_text(parse_schedule(to_csv(s))) == text, "the CSV form does not round-trip");
  } catch (const strata::Error&) {
    strata::fuzz::expect(false, "a parsed schedule's own text does not parse back");
  }
  return 0;
}
