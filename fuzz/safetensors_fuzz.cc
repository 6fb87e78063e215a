// libFuzzer harness for the safetensors reader (models/safetensors.h): the input becomes a
// file in memory (memfd, named through /proc/self/fd) and is read whole as fp32. A refusal
// is one line naming the file first (names from the header are shown escaped).
#include <sys/mman.h>
#include <unistd.h>

#include "fuzz/fuzz_util.h"
#include "models/safetensors.h"
#include "runtime/core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const int fd = memfd_create("fuzz.safetensors", MFD_CLOEXEC);
  strata::fuzz::expect(fd >= 0, "memfd_create failed");
  strata::fuzz::expect(size == 0 || write(fd, data, size) == static_cast<ssize_t>(size), "writing the memfd failed");
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  try {
    for (const auto& t : strata::model::read_safetensors(path)) {
      std::uint64_t numel = 1;
      for (auto d : t.shape) numel *= static_cast<std::uint64_t>(d);
      strata::fuzz::expect(numel == t.data.size(), "a tensor's values disagree with its shape");
    }
  } catch (const strata::Error& e) {
    // refused: the only way out besides the tensors
    strata::fuzz::expect_one_line(e.what(), "'" + path + "'");
  }
  close(fd);
  return 0;
}
