// libFuzzer harness for the tokenizer.json reader (tokenizer/hf_tokenizer.h): the input
// becomes a file in memory (memfd, named through /proc/self/fd) and is opened as a Hugging
// Face tokenizer; one that opens encodes a fixed text whose ids must all decode. A refusal is
// one line naming the file first (names and patterns from the file are shown escaped).
#include <sys/mman.h>
#include <unistd.h>

#include "fuzz/fuzz_util.h"
#include "runtime/core/error.h"
#include "tokenizer/hf_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const int fd = memfd_create("fuzz.tokenizer.json", MFD_CLOEXEC);
  strata::fuzz::expect(fd >= 0, "memfd_create failed");
  strata::fuzz::expect(size == 0 || write(fd, data, size) == static_cast<ssize_t>(size), "writing the memfd failed");
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  try {
    const auto tok = strata::tokenizer::HfTokenizer::open(path);
    static const std::string text =
        "Hello, world! It's 2026:\n\n  caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac <|endoftext|> ab";
    const auto ids = tok->encode(text);
    for (const auto id : ids) strata::fuzz::expect(id < tok->vocab_size(), "encode gave an id outside the vocabulary");
    (void)tok->decode(ids);  // every id encode gives has a spelling: a refusal here is a finding
  } catch (const strata::Error& e) {
    strata::fuzz::expect_one_line(e.what(), "tokenizer '" + path + "'");
  }
  close(fd);
  return 0;
}
