// strata_write_hf_dir (c_writer.h): the tensors streamed through HfDirWriter a piece at a time.
#include "models/hf/c_writer.h"

#include <algorithm>
#include <string>
#include <vector>

#include "engine/c_guard.h"
#include "models/hf/dir_writer.h"
#include "runtime/core/dtype.h"
#include "runtime/core/error.h"

extern "C" strata_status strata_write_hf_dir(const char* out_dir, const char* config_json, size_t count,
                                             const char* const* names, const int64_t* const* shapes, const int* ndims,
                                             const char* dtype, uint64_t max_shard_bytes, strata_weight_reader read,
                                             void* user) {
  return strata::capi::guarded([&] {
    using strata::Errc;
    STRATA_CHECK(out_dir != nullptr && config_json != nullptr && dtype != nullptr && read != nullptr &&
                     (count == 0 || (names != nullptr && shapes != nullptr && ndims != nullptr)),
                 Errc::invalid_argument,
                 "strata_write_hf_dir: out_dir, config_json, dtype, read, names, shapes and "
                 "ndims are required");
    strata::model::HfDirWriter::Tensors tensors;
    for (size_t i = 0; i < count; ++i) {
      STRATA_CHECK(names[i] != nullptr && ndims[i] >= 0 && (ndims[i] == 0 || shapes[i] != nullptr),
                   Errc::invalid_argument, "strata_write_hf_dir: tensor #", i, " has no name or shape");
      tensors.emplace_back(names[i], std::vector<std::int64_t>(shapes[i], shapes[i] + ndims[i]));
    }
    strata::model::HfDirWriter w(out_dir, config_json, tensors, strata::parse_dtype(dtype), max_shard_bytes);
    constexpr std::uint64_t kPiece = std::uint64_t{1} << 20;  // elements asked for at a time
    std::vector<float> buf;
    for (const auto& [name, shape] : tensors) {
      std::uint64_t numel = 1;
      for (auto d : shape) numel *= static_cast<std::uint64_t>(d);
      for (std::uint64_t at = 0; at < numel; at += kPiece) {
        const std::uint64_t n = std::min(kPiece, numel - at);
        buf.resize(n);
        STRATA_CHECK(read(user, name.c_str(), at, n, buf.data()) == 0, Errc::invalid_argument,
                     "strata_write_hf_dir: the reader failed for tensor '", name, "' (elements ", at, "-", at + n, ")");
        w.write(buf.data(), n);
      }
    }
    w.finish();
  });
}
