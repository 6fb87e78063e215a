// safetensors writer and F32 reader (see safetensors.h).
#include "models/safetensors.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "runtime/core/error.h"

namespace strata::model {

void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::uint64_t offset = 0;
  for (const auto& t : tensors) {
    const std::uint64_t bytes = t.data.size() * sizeof(float);
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string h = header.dump();
  while (h.size() % 8 != 0) h.push_back(' ');
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    STRATA_CHECK(f.good(), Errc::io, "cannot write '", tmp, "': ", errno_text(errno));
    const std::uint64_t n = h.size();
    unsigned char le[8];
    for (int i = 0; i < 8; ++i) le[i] = static_cast<unsigned char>(n >> (8 * i));
    f.write(reinterpret_cast<const char*>(le), 8);
    f.write(h.data(), static_cast<std::streamsize>(h.size()));
    for (const auto& t : tensors) {
      f.write(reinterpret_cast<const char*>(t.data.data()),
              static_cast<std::streamsize>(t.data.size() * sizeof(float)));
    }
    f.flush();
    STRATA_CHECK(f.good(), Errc::io, "writing '", tmp, "' failed: ", errno_text(errno), " (disk full?)");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  STRATA_CHECK(!ec, Errc::io, "cannot move '", tmp, "' to '", path, "': ", ec.message());
}

std::vector<NamedTensor> read_safetensors(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  STRATA_CHECK(f.good(), Errc::io, "cannot open '", path, "': ", errno_text(errno));
  unsigned char le[8];
  f.read(reinterpret_cast<char*>(le), 8);
  STRATA_CHECK(f.gcount() == 8, Errc::corrupt, "'", path, "' is too short to be a safetensors file");
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<std::uint64_t>(le[i]) << (8 * i);
  const auto size = std::filesystem::file_size(path);
  STRATA_CHECK(n <= size - 8, Errc::corrupt, "'", path, "': header length ", n, " exceeds the file (", size, " B)");
  std::string h(n, '\0');
  f.read(h.data(), static_cast<std::streamsize>(n));
  nlohmann::ordered_json header;
  try {
    header = nlohmann::ordered_json::parse(h);
  } catch (const std::exception& e) {
    STRATA_THROW(Errc::corrupt, "'", path, "': header is not JSON: ", e.what());
  }
  const std::uint64_t data_start = 8 + n;
  std::vector<NamedTensor> out;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const auto& v = it.value();
    STRATA_CHECK(v.value("dtype", "") == "F32", Errc::corrupt, "'", path, "': tensor '", it.key(), "' is not F32");
    NamedTensor t;
    t.name = it.key();
    t.shape = v.at("shape").get<std::vector<std::int64_t>>();
    const auto off = v.at("data_offsets").get<std::vector<std::uint64_t>>();
    STRATA_CHECK(off.size() == 2 && off[0] <= off[1] && data_start + off[1] <= size && (off[1] - off[0]) % 4 == 0,
                 Errc::corrupt, "'", path, "': tensor '", t.name, "' has bad data_offsets");
    std::uint64_t numel = 1;
    for (auto d : t.shape) numel *= static_cast<std::uint64_t>(d);
    STRATA_CHECK(numel * 4 == off[1] - off[0], Errc::corrupt, "'", path, "': tensor '", t.name,
                 "' shape does not match its byte range");
    t.data.resize(numel);
    f.seekg(static_cast<std::streamoff>(data_start + off[0]));
    f.read(reinterpret_cast<char*>(t.data.data()), static_cast<std::streamsize>(numel * 4));
    STRATA_CHECK(f.good(), Errc::corrupt, "'", path, "': tensor '", t.name, "' is truncated");
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace strata::model
