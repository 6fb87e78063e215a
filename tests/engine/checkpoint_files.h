// Test helpers over a checkpoint's files on disk: their exact bytes (to assert that nothing
// changed a committed checkpoint) and a flipped byte in the last chunk of rank 0's shard
// file (damage found only when the last tensors are read).
#pragma once

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>

namespace strata::test {

// Every regular file under `dir` (recursively), relative name -> bytes.
inline std::map<std::string, std::string> checkpoint_files(const std::string& dir) {
  namespace fs = std::filesystem;
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    std::ifstream in(e.path(), std::ios::binary);
    out[fs::relative(e.path(), dir).string()] =
        std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return out;
}

// Flips one byte 100 bytes before the end of `step_dir`/rank00000.bin.
inline void damage_last_chunk(const std::string& step_dir) {
  const std::string path = step_dir + "/rank00000.bin";
  const auto size = std::filesystem::file_size(path);
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(size - 100));
  const char c = static_cast<char>(f.get());
  f.seekp(static_cast<std::streamoff>(size - 100));
  f.put(static_cast<char>(c ^ 0x5a));
}

}  // namespace strata::test
