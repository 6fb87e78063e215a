// The config reader's bounds (config.h): files past the size limit, nesting past the depth
// limit, objects with too many keys, huge keys and values, numbers beyond a double and bad
// bytes each get a one-line error naming the file and position, within a second.
#include "tests/engine/config_test_util.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <thread>

#include "runtime/core/log.h"

using namespace strata;
using namespace strata::engine;
using namespace strata::engine::test;

namespace {

std::string nested(char open, int depth, const std::string& inner) {
  const char close = open == '[' ? ']' : '}';
  std::string text;
  text.reserve(depth * 6 + inner.size());
  for (int i = 0; i < depth; ++i) text += open == '[' ? "[" : "{\"a\": ";
  text += inner;
  text.append(depth, close);
  return text;
}

// The error parsing `text` throws, checked to be one line and to come within a second.
std::string quick_error(const std::string& text) {
  const auto start = std::chrono::steady_clock::now();
  const std::string message = error_of(text);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(seconds < 1.0);
  CHECK(std::none_of(message.begin(), message.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20; }));
  CHECK(message.size() < 2000);
  return message;
}

// Keeps the one warning per unknown top-level key out of the test output while alive.
struct QuietLog {
  LogLevel saved = log_level();
  QuietLog() { set_log_level(LogLevel::error); }
  ~QuietLog() { set_log_level(saved); }
};

std::string load_error(const std::string& path) {
  try {
    load_config(path, facts());
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("nesting past the depth limit is refused with the position, not a crash", "[config][negative][boundary]") {
  // Arrays 70,000 deep as a value of the wrong type once crashed printing the value.
  const std::string arrays = quick_error("{\"train_batch_size\": " + nested('[', 70000, "") + "}");
  CHECK_THAT(arrays, Catch::StartsWith("ds_config.json: objects and arrays nest deeper than 64 levels at line 1, "
                                       "column 85 (byte 85), in 'train_batch_size[0]"));
  for (int depth : {30000, 100000}) {
    CHECK_THAT(quick_error(with_batch("\"x\": " + nested('{', depth, "1"))),
               Catch::Contains("nest deeper than 64 levels") && Catch::Contains("in 'x.a.a.a"));
  }
  // The top-level object is level 1: 63 more levels are read (an unknown top-level key is
  // ignored), 64 are not.
  CHECK(parse(with_batch("\"x\": " + nested('[', kMaxConfigDepth - 1, "1"))).train_micro_batch_size_per_gpu == 1);
  CHECK_THAT(quick_error(with_batch("\"x\": " + nested('[', kMaxConfigDepth, "1"))),
             Catch::Contains("nest deeper than 64 levels at line 1"));
  CHECK_THAT(quick_error(with_batch("\"zero_optimization\": " + nested('[', 60, "2"))),
             Catch::Contains("zero_optimization = [[[[[[[[[[[[[[") && Catch::Contains("... (") &&
                 Catch::Contains("has the wrong type"));
}

TEST_CASE("a huge unknown key is refused quickly, echoed cut short, with no nearest-key search",
          "[config][negative][boundary]") {
  const std::string key(1000000, 'k');
  const std::string message = quick_error(with_batch("\"zero_optimization\": {\"" + key + "\": 1}"));
  CHECK_THAT(message, Catch::StartsWith("ds_config.json: unknown key 'zero_optimization." + std::string(60, 'k') +
                                        "... (1000000 bytes)'; the keys known in 'zero_optimization' are: "));
  // A long near miss is still a near miss of a short key when it is within the bound.
  CHECK_THAT(quick_error(with_batch("\"zero_optimization\": {\"stagee\": 1}")), Catch::Contains("did you mean"));
  // At the top level an unknown key is ignored with a warning: cut short there too.
  StderrCapture capture;
  CHECK(parse(with_batch("\"" + key + "\": 1")).train_micro_batch_size_per_gpu == 1);
  const std::string said = capture.text();
  CHECK_THAT(said, Catch::Contains("unknown key '" + std::string(60, 'k') + "... (1000000 bytes)' is ignored"));
  CHECK(said.size() < 1000);
}

TEST_CASE("huge values and values with control characters are echoed on one line, cut short",
          "[config][negative][boundary]") {
  const std::string big(1000000, 'v');
  CHECK_THAT(
      quick_error(with_batch("\"optimizer\": {\"type\": \"" + big + "\"}")),
      Catch::Contains("optimizer.type = \"" + std::string(56, 'v') + "... (1000002 bytes) is not a valid choice"));
  CHECK_THAT(quick_error(with_batch("\"memory_budget\": {\"host\": \"" + big + "\"}")),
             Catch::Contains("memory_budget.host = \"vvvv") && Catch::Contains("is not a byte size"));
  CHECK_THAT(quick_error(with_batch(R"("memory_budget": {"host": "8\nGiB"})")),
             Catch::Contains(R"(memory_budget.host = "8\nGiB" is not a byte size)"));
  CHECK_THAT(quick_error(with_batch(R"("zero_optimization": {"reduce_bucket_size": "5e8\t"})")),
             Catch::Contains("is not a count"));
  CHECK_THAT(quick_error(with_batch(R"("zero_optimization": {"st\nage": 1})")),
             Catch::Contains(R"(unknown key 'zero_optimization.st\nage')"));
  CHECK_THAT(quick_error(with_batch(R"("gradient_clipping": 1e300)")), Catch::Contains("is out of range"));
}

TEST_CASE("numbers beyond a double are refused with the file, key and position", "[config][negative][boundary]") {
  CHECK(quick_error("{\"train_batch_size\": 1e999}") ==
        "ds_config.json: invalid JSON at line 1, column 22 (byte 22), in 'train_batch_size': number 1e999 is out "
        "of range: JSON numbers here must lie within +-1.7e308; write a smaller one");
  CHECK_THAT(
      quick_error(with_batch("\n\"optimizer\": {\"params\": {\"lr\": -1e999}}")),
      Catch::Contains("at line 2, column 32 (byte 71), in 'optimizer.params.lr': number -1e999 is out of range"));
  CHECK_THAT(quick_error(with_batch("\"x\": [1, 2, 1" + std::string(400, '0') + "]")),
             Catch::Contains("in 'x[2]': number 1" + std::string(59, '0') + "... (401 bytes) is out of range"));
  CHECK(parse(with_batch("\"gradient_clipping\": 1e-999")).gradient_clipping == 0.0f);  // underflow is 0
}

TEST_CASE("JSON errors name the file, position and key path on one line", "[config][negative]") {
  CHECK(quick_error(R"({"zero_optimization": {"stage": }})") ==
        "ds_config.json: invalid JSON at line 1, column 33 (byte 33), in 'zero_optimization.stage': syntax error "
        "while parsing value - unexpected '}'; expected '[', '{', or a literal");
  CHECK_THAT(quick_error("{\"train_batch_size\": 8,\n\"optimizer\": {\"type\": \"Adam\",\n\"type\": \"Lion\"}}"),
             Catch::StartsWith("ds_config.json: key 'optimizer.type' appears twice (again at line 3, column 1)"));
  // Bytes that are not UTF-8, control characters and an unterminated string: the quoted
  // token is escaped and cut short.
  CHECK_THAT(quick_error("{\"train_batch_size\": \"\xff\xfe\"}"),
             Catch::Contains("in 'train_batch_size'") && Catch::Contains("\\xff"));
  CHECK_THAT(quick_error("{\"train_batch_size\": \"a\nb\"}"), Catch::Contains("invalid JSON at line 1, column 24"));
  CHECK_THAT(quick_error("{\"train_batch_size\": \"" + std::string(1000000, 'x')),
             Catch::Contains("last read: '\"xxxxxxxx") && Catch::Contains("... (1000001 bytes)'"));
  // nlohmann would take a NUL byte for the end of the file and ignore the rest.
  CHECK(quick_error(std::string("{\"train_batch_size\": 8}\0{\"x\": 1}", 32)) ==
        "ds_config.json: invalid JSON at line 1, column 24 (byte 24): a NUL byte: a config is text; check that it is "
        "the config you meant");
}

TEST_CASE("objects with more keys than the limit are refused; at the limit they are read",
          "[config][negative][boundary]") {
  std::string body = "\"train_micro_batch_size_per_gpu\": 1";
  for (std::size_t i = 1; i < kMaxConfigKeys; ++i) body += ", \"unknown_" + std::to_string(i) + "\": 0";
  {
    QuietLog quiet;
    CHECK(parse("{" + body + "}").train_micro_batch_size_per_gpu == 1);
  }
  CHECK_THAT(quick_error("{" + body + ", \"one_more\": 0}"),
             Catch::StartsWith("ds_config.json: an object holds more than 256 keys at line 1") &&
                 Catch::Contains("a few dozen keys per object"));
  // Many long keys that differ only at their ends stay linear.
  std::string long_keys = "\"train_micro_batch_size_per_gpu\": 1";
  for (int i = 0; i < 200; ++i) long_keys += ", \"" + std::string(50000, 'k') + std::to_string(1000 + i) + "\": 0";
  QuietLog quiet;
  const auto start = std::chrono::steady_clock::now();
  CHECK(parse("{" + long_keys + "}").train_micro_batch_size_per_gpu == 1);
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < 1.0);
}

TEST_CASE("config text and files past the size limit are refused naming the size and the limit",
          "[config][negative][boundary]") {
  CHECK(quick_error(std::string(kMaxConfigBytes + 1, ' ')) ==
        "ds_config.json: 16777217 bytes of JSON is over the 16 MiB limit for a config file: DeepSpeed configs are a "
        "few KiB, nest a few levels and hold a few dozen keys per object; check that it is the config you meant");
  CHECK_THAT(load_error("/dev/zero"),
             Catch::StartsWith("config file '/dev/zero' holds more than the 16 MiB limit for a config file (reading "
                               "stopped at 16777217 bytes)"));
  strata::test::TempDir dir("strata-config-test");
  const std::string big = dir.file("big.json");
  {
    const int fd = ::open(big.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    REQUIRE(fd >= 0);
    REQUIRE(::ftruncate(fd, static_cast<off_t>(kMaxConfigBytes) + 1) == 0);  // sparse: nothing written
    ::close(fd);
  }
  CHECK(load_error(big) == "config file '" + big +
                               "' is 16777217 bytes, over the 16 MiB limit for a config file: DeepSpeed configs are a "
                               "few KiB: check that it is the config you meant");
  // A pipe that never ends stops at the limit too; the writer sees EPIPE (SIGPIPE blocked).
  const std::string fifo = dir.file("fifo.json");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  std::thread writer([&] {
    sigset_t pipe_signal;
    sigemptyset(&pipe_signal);
    sigaddset(&pipe_signal, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_signal, nullptr);
    const int fd = ::open(fifo.c_str(), O_WRONLY);
    const std::string chunk(1 << 16, ' ');
    while (fd >= 0 && ::write(fd, chunk.data(), chunk.size()) > 0) {
    }
    if (fd >= 0) ::close(fd);
  });
  CHECK_THAT(load_error(fifo), Catch::Contains("holds more than the 16 MiB limit"));
  writer.join();
}
