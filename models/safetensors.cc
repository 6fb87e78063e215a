// Streaming safetensors writer and reader (see safetensors.h).
#include "models/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "runtime/core/error.h"

namespace strata::model {
namespace {

constexpr std::size_t kBufferBytes = std::size_t{1} << 20;
// Hugging Face safetensors' MAX_HEADER_SIZE: a longer header is refused before it is read,
// so a damaged length cannot ask for gigabytes.
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

const char* st_dtype(DType t, const std::string& path, const std::string& name) {
  switch (t) {
    case DType::fp32:
      return "F32";
    case DType::bf16:
      return "BF16";
    case DType::fp16:
      return "F16";
    default:
      STRATA_THROW(Errc::invalid_argument, "'", path, "': tensor '", name, "' has dtype ", dtype_name(t),
                   "; safetensors files here hold F32, BF16 or F16");
  }
}

std::uint64_t numel_of(const std::vector<std::int64_t>& shape) {
  std::uint64_t n = 1;
  for (auto d : shape) n *= static_cast<std::uint64_t>(d);
  return n;
}

// The header's JSON, refusing a key that appears twice in one object (nlohmann::json would
// keep the last silently, so two tensors of one name or two "data_offsets" would read as
// one). The parser callback sees each object open and close and each key in between.
nlohmann::ordered_json parse_header(const std::string& path, const std::string& text) {
  std::vector<std::set<std::string>> open;  // keys seen so far, per object being parsed
  std::string tensor;                       // the top-level key being parsed
  std::string dup_tensor, dup_key;
  bool dup = false;
  const auto cb = [&](int depth, nlohmann::ordered_json::parse_event_t event, nlohmann::ordered_json& parsed) {
    using E = nlohmann::ordered_json::parse_event_t;
    if (event == E::object_start) open.emplace_back();
    if (event == E::object_end && !open.empty()) open.pop_back();
    if (event == E::key && !open.empty() && parsed.is_string()) {
      const auto& key = parsed.get_ref<const std::string&>();
      if (depth == 1) tensor = key;  // a key of the header object itself
      if (!open.back().insert(key).second && !dup) {
        dup = true;
        dup_tensor = depth == 1 ? std::string() : tensor;
        dup_key = key;
      }
    }
    return true;
  };
  nlohmann::ordered_json header;
  try {
    header = nlohmann::ordered_json::parse(text, cb);
  } catch (const std::exception& e) {
    STRATA_THROW(Errc::corrupt, "'", path, "': header is not JSON: ", e.what());
  }
  if (dup && dup_tensor.empty()) {
    STRATA_THROW(Errc::corrupt, "'", path, "': tensor '", printable(dup_key),
                 "' appears twice in the header; a safetensors file names each tensor once (the file is damaged)");
  }
  if (dup) {
    const std::string owner =
        dup_tensor == "__metadata__" ? dup_tensor : str_cat("tensor '", printable(dup_tensor), "'");
    STRATA_THROW(Errc::corrupt, "'", path, "': ", owner, " has the key '", printable(dup_key),
                 "' twice (the file is damaged)");
  }
  return header;
}

// safetensors' dtypes (its format section) and their bytes per element, 0 for a name that
// is none of them; Strata reads three of them.
std::uint64_t dtype_bytes(const std::string& dt) {
  static const std::map<std::string, std::uint64_t> known = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
      {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4},     {"F64", 8},     {"I64", 8}, {"U64", 8}};
  const auto it = known.find(dt);
  return it == known.end() ? 0 : it->second;
}

// One tensor's bytes in the data region, whatever its dtype (for the tiling check).
struct ByteRange {
  std::string name;
  std::uint64_t begin = 0, end = 0;
};

// One tensor's entry: {"dtype", "shape", "data_offsets": [begin, end]} with whole, non-
// negative numbers only (a float or a negative one would wrap in a conversion), a shape
// whose byte size fits in 64 bits, and offsets inside the `data_bytes` after the header
// spanning exactly the shape's bytes. A dtype other than F32, BF16 and F16 is refused, or
// with `other` given, described there (t.dtype is then meaningless). `bytes_out` gets its range.
TensorInfo parse_entry(const std::string& path, const std::string& name, const nlohmann::ordered_json& v,
                       std::uint64_t data_bytes, OtherTensor* other, ByteRange& bytes_out) {
  TensorInfo t;
  t.name = name;
  const auto bad = [&](const std::string& what) {
    STRATA_THROW(Errc::corrupt, "'", path, "': tensor '", printable(name), "' ", what);
  };
  const auto whole = [](const nlohmann::ordered_json& x) {
    return x.is_number_unsigned() || (x.is_number_integer() && x.get<std::int64_t>() >= 0);
  };
  if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
    bad("has a malformed entry: expected {\"dtype\", \"shape\", \"data_offsets\"}");
  const auto& dtype = v["dtype"];
  const std::string dt = dtype.is_string() ? dtype.get<std::string>() : std::string("a ") + dtype.type_name();
  const std::uint64_t esize = dtype_bytes(dt);
  if (esize == 0) bad(str_cat("has dtype ", printable(dt), ", which is not a safetensors dtype (damaged?)"));
  const bool readable = dt == "F32" || dt == "BF16" || dt == "F16";
  if (!readable && other == nullptr) bad(str_cat("has dtype ", dt, "; Strata reads F32, BF16 and F16"));
  t.dtype = dt == "F32" ? DType::fp32 : dt == "BF16" ? DType::bf16 : DType::fp16;
  const auto& shape = v["shape"];
  if (!shape.is_array()) bad("has a shape that is not an array");
  t.numel = 1;
  for (const auto& d : shape) {
    if (!whole(d) || d.get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      bad(str_cat("has a shape with ", d.is_number() ? d.dump() : std::string("a ") + d.type_name(),
                  " in it: dimensions are whole numbers >= 0"));
    t.shape.push_back(d.get<std::int64_t>());
    if (__builtin_mul_overflow(t.numel, d.get<std::uint64_t>(), &t.numel)) bad("has a shape too large for 64 bits");
  }
  std::uint64_t bytes = 0;
  if (__builtin_mul_overflow(t.numel, esize, &bytes)) bad("has a shape too large for 64 bits");
  const auto& off = v["data_offsets"];
  if (!off.is_array() || off.size() != 2 || !whole(off[0]) || !whole(off[1]))
    bad("has data_offsets that are not [begin, end] in bytes");
  const std::uint64_t begin = off[0].get<std::uint64_t>(), end = off[1].get<std::uint64_t>();
  const std::string range = str_cat("[", begin, ", ", end, "]");
  if (begin > end) bad(str_cat("has data_offsets ", range, " that begin after they end"));
  if (end > data_bytes)
    bad(str_cat("has data_offsets ", range, " that lie past the end of the file (its data region holds ", data_bytes,
                " bytes): the file is truncated or damaged"));
  if (end - begin != bytes)
    bad(str_cat("has data_offsets ", range, " spanning ", end - begin, " bytes, but its shape ", shape.dump(), " of ",
                dt, " needs ", bytes));
  t.offset = begin;
  bytes_out = {name, begin, end};
  if (!readable) *other = {name, dt, t.shape, bytes};
  return t;
}

// safetensors' layout rule: the tensors' byte ranges, in offset order, tile the data region
// from 0 to its end with no overlap and no hole.
void check_tiling(const std::string& path, std::vector<ByteRange> ranges, std::uint64_t data_bytes) {
  std::sort(ranges.begin(), ranges.end(), [](const ByteRange& a, const ByteRange& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t at = 0;
  const ByteRange* prev = nullptr;
  for (const ByteRange& t : ranges) {
    STRATA_CHECK(t.begin >= at, Errc::corrupt, "'", path, "': tensor '", printable(t.name), "' (bytes ", t.begin, "-",
                 t.end, ") overlaps tensor '", prev ? printable(prev->name) : "", "' (bytes ", prev ? prev->begin : 0,
                 "-", at, "): the file is damaged");
    STRATA_CHECK(t.begin == at, Errc::corrupt, "'", path, "': bytes ", at, "-", t.begin, " before tensor '",
                 printable(t.name), "' belong to no tensor; safetensors files have no holes (the file is damaged)");
    at = t.end;
    prev = &t;
  }
  STRATA_CHECK(at == data_bytes, Errc::corrupt, "'", path, "': bytes ", at, "-", data_bytes, " of the data region ",
               prev ? str_cat("after tensor '", printable(prev->name), "' ") : std::string(),
               "belong to no tensor; safetensors files have no holes (the file is damaged)");
}

}  // namespace

SafetensorsWriter::SafetensorsWriter(std::string path, std::vector<TensorInfo> tensors,
                                     const std::map<std::string, std::string>& metadata)
    : path_(std::move(path)), tmp_(path_ + ".tmp"), tensors_(std::move(tensors)), buffer_(kBufferBytes) {
  // Refused before any byte is written: the rename at the end could not replace a directory.
  struct stat st {};
  STRATA_CHECK(::stat(path_.c_str(), &st) != 0 || !S_ISDIR(st.st_mode), Errc::invalid_argument, "'", path_,
               "' is a directory: give the safetensors file's path (for example ", path_, "/model.safetensors)");
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::uint64_t offset = 0;
  for (auto& t : tensors_) {
    STRATA_CHECK(!header.contains(t.name), Errc::invalid_argument, "'", path_, "': tensor name '", t.name,
                 t.name == "__metadata__" ? "' is safetensors' metadata key" : "' is given twice",
                 ": each tensor needs a name of its own");
    t.numel = numel_of(t.shape);
    t.offset = offset;
    const std::uint64_t bytes = t.numel * dtype_size(t.dtype);
    header[t.name] = {
        {"dtype", st_dtype(t.dtype, path_, t.name)}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string h = header.dump();
  while (h.size() % 8 != 0) h.push_back(' ');
  STRATA_CHECK(h.size() <= kMaxHeaderBytes, Errc::invalid_argument, "'", path_, "': the header would be ", h.size(),
               " bytes, above safetensors' bound of ", kMaxHeaderBytes, " (", tensors_.size(),
               " tensors): no reader would accept the file; write fewer tensors per file");
  // A fresh file, never one left at tmp_: truncating a stale link would write through it.
  ::unlink(tmp_.c_str());
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  STRATA_CHECK(fd_ >= 0, Errc::io, "cannot write '", tmp_, "': ", errno_text(errno));
  unsigned char le[8];
  for (int i = 0; i < 8; ++i) le[i] = static_cast<unsigned char>(static_cast<std::uint64_t>(h.size()) >> (8 * i));
  try {
    put(le, 8);
    put(h.data(), h.size());
  } catch (...) {
    ::close(fd_);  // the destructor does not run for a constructor that throws
    ::unlink(tmp_.c_str());
    throw;
  }
  while (current_ < tensors_.size() && tensors_[current_].numel == 0) ++current_;
}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ < 0) return;
  ::close(fd_);
  ::unlink(tmp_.c_str());
}

void SafetensorsWriter::put(const void* data, std::size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::pwrite(fd_, p, bytes, static_cast<off_t>(file_offset_));
    if (n < 0 && errno == EINTR) continue;
    STRATA_CHECK(n > 0, Errc::io, "writing '", tmp_, "' at byte ", file_offset_,
                 " failed: ", errno_text(n < 0 ? errno : ENOSPC), " (disk full?)");
    p += n;
    bytes -= static_cast<std::size_t>(n);
    file_offset_ += static_cast<std::uint64_t>(n);
  }
}

void SafetensorsWriter::write(const float* values, std::uint64_t count) {
  while (count > 0) {
    STRATA_CHECK(current_ < tensors_.size(), Errc::invalid_argument, "'", path_, "': ", count,
                 " values written past the last tensor");
    const TensorInfo& t = tensors_[current_];
    const std::size_t esize = dtype_size(t.dtype);
    const std::uint64_t take = std::min<std::uint64_t>({count, t.numel - written_, buffer_.size() / esize});
    convert(values, DType::fp32, buffer_.data(), t.dtype, take);
    put(buffer_.data(), take * esize);
    values += take;
    count -= take;
    written_ += take;
    if (written_ == t.numel) {
      written_ = 0;
      ++current_;
      while (current_ < tensors_.size() && tensors_[current_].numel == 0) ++current_;
    }
  }
}

void SafetensorsWriter::finish() {
  STRATA_CHECK(current_ == tensors_.size(), Errc::invalid_argument, "'", path_, "': tensor '",
               current_ < tensors_.size() ? tensors_[current_].name : "", "' was not written whole");
  STRATA_CHECK(::fsync(fd_) == 0, Errc::io, "fsync of '", tmp_, "' failed: ", errno_text(errno));
  ::close(fd_);
  fd_ = -1;
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp_.c_str());
    STRATA_THROW(Errc::io, "cannot move '", tmp_, "' to '", path_, "': ", errno_text(err));
  }
}

SafetensorsReader::SafetensorsReader(std::string path, bool list_other_dtypes)
    : path_(std::move(path)), list_other_dtypes_(list_other_dtypes) {
  // O_NONBLOCK: a FIFO or device given as the file must not block the open; fstat refuses it.
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  STRATA_CHECK(fd_ >= 0, Errc::io, "cannot open '", path_, "': ", errno_text(errno));
  try {
    read_header();
  } catch (...) {
    ::close(fd_);  // the destructor does not run for a constructor that throws
    throw;
  }
}

void SafetensorsReader::read_header() {
  struct stat st {};
  STRATA_CHECK(::fstat(fd_, &st) == 0, Errc::io, "cannot stat '", path_, "': ", errno_text(errno));
  STRATA_CHECK(S_ISREG(st.st_mode), Errc::invalid_argument, "'", path_, "' is not a regular file (",
               S_ISDIR(st.st_mode)    ? "a directory"
               : S_ISFIFO(st.st_mode) ? "a FIFO"
                                      : "a device or socket",
               "): give a safetensors file");
  const std::uint64_t size = static_cast<std::uint64_t>(st.st_size);
  unsigned char le[8];
  STRATA_CHECK(size >= 8 && ::pread(fd_, le, 8, 0) == 8, Errc::corrupt, "'", path_,
               "' is too short to be a safetensors file");
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<std::uint64_t>(le[i]) << (8 * i);
  STRATA_CHECK(n <= kMaxHeaderBytes, Errc::corrupt, "'", path_, "': header length ", n,
               " bytes is above safetensors' bound of ", kMaxHeaderBytes,
               " bytes: the file is damaged or not a safetensors file");
  STRATA_CHECK(n <= size - 8, Errc::corrupt, "'", path_, "': header length ", n, " exceeds the file (", size, " B)");
  std::string h(n, '\0');
  STRATA_CHECK(::pread(fd_, h.data(), n, 8) == static_cast<ssize_t>(n), Errc::corrupt, "'", path_,
               "': the header cannot be read");
  const auto header = parse_header(path_, h);
  STRATA_CHECK(header.is_object(), Errc::corrupt, "'", path_, "': the header is a JSON ", header.type_name(),
               ", not an object of tensors");
  data_start_ = 8 + n;
  const std::uint64_t data_bytes = size - data_start_;
  std::vector<ByteRange> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      STRATA_CHECK(it.value().is_object(), Errc::corrupt, "'", path_, "': __metadata__ is a JSON ",
                   it.value().type_name(), ", not an object of strings");
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        STRATA_CHECK(m.value().is_string(), Errc::corrupt, "'", path_, "': __metadata__ entry '", printable(m.key()),
                     "' is a JSON ", m.value().type_name(), ", not a string");
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    OtherTensor other;
    ranges.emplace_back();
    auto t = parse_entry(path_, it.key(), it.value(), data_bytes, list_other_dtypes_ ? &other : nullptr, ranges.back());
    if (other.dtype.empty())  // a readable dtype (an unreadable one has its name there)
      tensors_.push_back(std::move(t));
    else
      other_tensors_.push_back(std::move(other));
  }
  check_tiling(path_, std::move(ranges), data_bytes);
}

SafetensorsReader::~SafetensorsReader() {
  if (fd_ >= 0) ::close(fd_);
}

const TensorInfo* SafetensorsReader::find(const std::string& name) const noexcept {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

void SafetensorsReader::read(const TensorInfo& t, std::uint64_t elem, std::uint64_t count, float* out) {
  STRATA_CHECK(elem + count <= t.numel, Errc::invalid_argument, "'", path_, "': elements ", elem, "-", elem + count,
               " are outside tensor '", t.name, "' (", t.numel, ")");
  const std::size_t esize = dtype_size(t.dtype);
  // Allocated at the first read, so a directory of many shards costs no buffer per shard
  // until it is read from.
  if (buffer_.empty()) buffer_.resize(kBufferBytes);
  while (count > 0) {
    const std::uint64_t take = std::min<std::uint64_t>(count, buffer_.size() / esize);
    const std::uint64_t at = data_start_ + t.offset + elem * esize;
    const ssize_t n = ::pread(fd_, buffer_.data(), take * esize, static_cast<off_t>(at));
    STRATA_CHECK(n == static_cast<ssize_t>(take * esize), Errc::corrupt, "'", path_, "': tensor '", t.name,
                 "' cannot be read at byte ", at, ": ", n < 0 ? errno_text(errno) : std::string("truncated"));
    convert(buffer_.data(), t.dtype, out, DType::fp32, take);
    out += take;
    elem += take;
    count -= take;
  }
}

void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<TensorInfo> info;
  for (const auto& t : tensors) {
    info.push_back({t.name, DType::fp32, t.shape});
    STRATA_CHECK(numel_of(t.shape) == t.data.size(), Errc::invalid_argument, "write_safetensors('", path,
                 "'): tensor '", t.name, "' holds ", t.data.size(), " values for its shape's ", numel_of(t.shape));
  }
  SafetensorsWriter w(path, std::move(info), metadata);
  for (const auto& t : tensors) w.write(t.data.data(), t.data.size());
  w.finish();
}

std::vector<NamedTensor> read_safetensors(const std::string& path) {
  SafetensorsReader r(path);
  std::vector<NamedTensor> out;
  for (const auto& t : r.tensors()) {
    NamedTensor n{t.name, t.shape, std::vector<float>(t.numel)};
    r.read(t, 0, t.numel, n.data.data());
    out.push_back(std::move(n));
  }
  return out;
}

}  // namespace strata::model
