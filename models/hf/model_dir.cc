// Reading a Hugging Face model directory (see model_dir.h).
#include "models/hf/model_dir.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <set>

#include "models/hf/format.h"
#include "runtime/core/error.h"

namespace strata::model {
namespace {

// config.json and the index are small; a larger file in their place is damage (or a FIFO
// or a device), refused before it is read.
constexpr std::uint64_t kMaxJsonBytes = std::uint64_t{256} << 20;

enum class Kind { none, file, other };

Kind kind_of(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return Kind::none;
  return S_ISREG(st.st_mode) ? Kind::file : Kind::other;
}

std::string read_small_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  STRATA_CHECK(fd >= 0, Errc::io, "cannot open '", path, "': ", errno_text(errno));
  struct stat st {};
  const bool ok = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  if (!ok || static_cast<std::uint64_t>(st.st_size) > kMaxJsonBytes) {
    ::close(fd);
    STRATA_THROW(Errc::invalid_argument, "'", path, "' is ",
                 ok ? str_cat("larger than ", kMaxJsonBytes >> 20, " MiB") : std::string("not a regular file"),
                 ": a Hugging Face model directory holds a small JSON file there");
  }
  std::string text(static_cast<std::size_t>(st.st_size), '\0');
  std::size_t at = 0;
  while (at < text.size()) {
    const ssize_t n = ::pread(fd, text.data() + at, text.size() - at, static_cast<off_t>(at));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : 0;
      ::close(fd);
      STRATA_THROW(Errc::io, "reading '", path, "' failed: ", err ? errno_text(err) : std::string("truncated"));
    }
    at += static_cast<std::size_t>(n);
  }
  ::close(fd);
  return text;
}

nlohmann::json parse_object(const std::string& path, const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    STRATA_THROW(Errc::corrupt, "'", path, "' is not JSON (", e.what(), "): the file is damaged; download it again");
  }
  STRATA_CHECK(j.is_object(), Errc::corrupt, "'", path, "' holds a JSON ", j.type_name(),
               ", not an object: the file is damaged; download it again");
  return j;
}

// A shard name from weight_map: a relative path that cannot leave the directory. Links are
// not followed here on purpose: Hugging Face's cache keeps each snapshot's files as links
// into its blobs directory.
void check_shard_name(const std::string& index_path, const std::string& tensor, const std::string& name) {
  bool escapes = name.empty() || name.front() == '/';
  for (std::size_t begin = 0; !escapes && begin <= name.size();) {
    const std::size_t end = std::min(name.find('/', begin), name.size());
    if (name.compare(begin, end - begin, "..") == 0 && end - begin == 2) escapes = true;
    begin = end + 1;
  }
  STRATA_CHECK(!escapes && name.find('\0') == std::string::npos, Errc::corrupt, "'", index_path,
               "': weight_map puts tensor '", printable(tensor), "' in '", printable(name),
               "', which is not a file inside the model directory (absolute, empty or with '..'): the index is "
               "damaged or hostile; use the index that came with the weights");
}

}  // namespace

HfModelDir::HfModelDir(std::string dir) : dir_(std::move(dir)) {
  while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
  struct stat st {};
  STRATA_CHECK(::stat(dir_.c_str(), &st) == 0, Errc::invalid_argument, "Hugging Face model directory '", dir_,
               "' cannot be opened: ", errno_text(errno));
  STRATA_CHECK(S_ISDIR(st.st_mode), Errc::invalid_argument, "'", dir_,
               "' is not a directory: give the Hugging Face model directory (the one holding config.json)");
  read_config();
  const std::string single = dir_ + "/" + hf::kSingleName, index = dir_ + "/" + hf::kIndexName;
  const Kind s = kind_of(single), i = kind_of(index);
  STRATA_CHECK(s == Kind::none || i == Kind::none, Errc::invalid_argument, "'", dir_, "' holds both ", hf::kSingleName,
               " and ", hf::kIndexName, ", so which weights are meant is unclear: remove the one that is stale");
  if (s != Kind::none) open_single();
  if (i != Kind::none) open_index();
  if (s != Kind::none || i != Kind::none) return;
  // No safetensors weights. config.json alone is a model to initialise; PyTorch's pickled
  // weights beside it are weights Strata cannot read, which must not pass for none.
  for (const char* pickled : {"pytorch_model.bin", "pytorch_model.bin.index.json"}) {
    STRATA_CHECK(kind_of(dir_ + "/" + pickled) == Kind::none, Errc::unsupported, "'", dir_, "' holds its weights as ",
                 pickled,
                 " (PyTorch's pickle format), which Strata does not read: download the model's safetensors "
                 "files, or convert it with transformers (save_pretrained(dir, safe_serialization=True))");
  }
}

HfModelDir::~HfModelDir() = default;

void HfModelDir::read_config() {
  const std::string path = dir_ + "/" + hf::kConfigName;
  STRATA_CHECK(kind_of(path) != Kind::none, Errc::invalid_argument, "'", dir_, "' has no ", hf::kConfigName,
               ": a Hugging Face model directory holds the model's config.json beside its weights (download it too)");
  config_text_ = read_small_file(path);
  config_ = parse_object(path, config_text_);
}

void HfModelDir::add_shard(const std::string& name) {
  const std::string path = dir_ + "/" + name;
  auto reader = std::make_unique<SafetensorsReader>(path, /*list_other_dtypes=*/true);
  const std::size_t s = shards_.size();
  const auto place = [&](const std::string& tensor, Place p, std::uint64_t bytes) {
    const auto [it, fresh] = places_.emplace(tensor, p);
    STRATA_CHECK(fresh, Errc::corrupt, "'", dir_, "': tensor '", tensor, "' is in both '",
                 shard_names_[it->second.shard], "' and '", name,
                 "': a tensor lies in one shard only; the weights are damaged or from two uploads mixed");
    total_bytes_ += bytes;
  };
  for (const auto& t : reader->tensors()) {
    place(t.name, {s, tensors_.size(), true}, t.numel * dtype_size(t.dtype));
    tensors_.push_back(t);
  }
  for (const auto& t : reader->other_tensors()) {
    place(t.name, {s, others_.size(), false}, t.bytes);
    others_.push_back(t);
  }
  shard_names_.push_back(name);
  shards_.push_back(std::move(reader));
}

void HfModelDir::open_single() { add_shard(hf::kSingleName); }

void HfModelDir::open_index() {
  const std::string path = dir_ + "/" + hf::kIndexName;
  const auto index = parse_object(path, read_small_file(path));
  STRATA_CHECK(index.contains("weight_map") && index["weight_map"].is_object(), Errc::corrupt, "'", path,
               "' has no weight_map object (tensor name to shard file): the index is damaged; download it again");
  const auto& map = index["weight_map"];
  std::map<std::string, std::vector<std::string>> by_shard;  // shard -> its tensors per the map
  for (auto it = map.begin(); it != map.end(); ++it) {
    STRATA_CHECK(it.value().is_string(), Errc::corrupt, "'", path, "': weight_map entry '", printable(it.key()),
                 "' is a JSON ", it.value().type_name(),
                 ", not a shard file name: the index is damaged; download it again");
    const auto& shard = it.value().get_ref<const std::string&>();
    check_shard_name(path, it.key(), shard);
    by_shard[shard].push_back(it.key());
  }
  for (const auto& [shard, names] : by_shard) {
    const Kind k = kind_of(dir_ + "/" + shard);
    STRATA_CHECK(k == Kind::file, Errc::invalid_argument, "'", dir_, "/", shard, "', the shard that ", hf::kIndexName,
                 " names for ", names.size(), " tensor", names.size() == 1 ? "" : "s", " (such as '",
                 printable(names.front()), "'), ", k == Kind::none ? "is missing" : "is not a regular file",
                 ": the download is incomplete; fetch that file again");
    add_shard(shard);
  }
  // Both directions: the map's entries against the shards' headers.
  for (const auto& [shard, names] : by_shard) {
    for (const auto& n : names) {
      const auto it = places_.find(n);
      STRATA_CHECK(it != places_.end(), Errc::corrupt, "'", path, "': weight_map puts tensor '", printable(n), "' in '",
                   shard,
                   "', which does not hold it (nor does any other shard): the index and the weights do not match; "
                   "download them again together");
      STRATA_CHECK(shard_names_[it->second.shard] == shard, Errc::corrupt, "'", path, "': weight_map puts tensor '",
                   printable(n), "' in '", shard, "', but it lies in '", shard_names_[it->second.shard],
                   "': the index and the weights do not match; download them again together");
    }
  }
  for (const auto& [name, p] : places_) {
    STRATA_CHECK(map.contains(name), Errc::corrupt, "'", dir_, "/", shard_names_[p.shard], "' holds tensor '", name,
                 "', which ", hf::kIndexName,
                 "'s weight_map does not list: the index and the weights do not match; download them again together");
  }
  if (!index.contains("metadata")) return;
  const auto& meta = index["metadata"];
  STRATA_CHECK(meta.is_object(), Errc::corrupt, "'", path, "': metadata is a JSON ", meta.type_name(),
               ", not an object: the index is damaged; download it again");
  if (!meta.contains("total_size") || meta["total_size"].is_null()) return;
  const auto& total = meta["total_size"];
  // Some uploads write the size as a float (13476839424.0): a whole value is accepted.
  const double as_double = total.is_number() ? total.get<double>() : -1;
  const bool whole = total.is_number_unsigned() || (total.is_number_float() && as_double >= 0 && as_double < 1.8e19 &&
                                                    std::floor(as_double) == as_double);
  STRATA_CHECK(whole, Errc::corrupt, "'", path, "': metadata.total_size is ", total.dump(),
               ", not a byte count: the index is damaged; download it again");
  STRATA_CHECK(total.get<std::uint64_t>() == total_bytes_, Errc::corrupt, "'", path, "': metadata.total_size is ",
               total.get<std::uint64_t>(), " bytes, but the ", shard_names_.size(), " shards' tensors hold ",
               total_bytes_,
               ": the index and the weights do not match (a shard from another upload?); download them "
               "again together");
}

const TensorInfo* HfModelDir::find(const std::string& name) const noexcept {
  const auto it = places_.find(name);
  return it == places_.end() || !it->second.readable ? nullptr : &tensors_[it->second.index];
}

std::string HfModelDir::shard_of(const std::string& name) const {
  const auto it = places_.find(name);
  return it == places_.end() ? std::string() : shard_names_[it->second.shard];
}

void HfModelDir::read(const std::string& name, std::uint64_t elem, std::uint64_t count, float* out) {
  const auto it = places_.find(name);
  STRATA_CHECK(it != places_.end(), Errc::invalid_argument, "'", dir_, "' holds no tensor '", name, "'");
  STRATA_CHECK(it->second.readable, Errc::invalid_argument, "'", dir_, "': tensor '", name, "' is ",
               others_[it->second.index].dtype, "; Strata reads F32, BF16 and F16");
  const TensorInfo& t = tensors_[it->second.index];
  shards_[it->second.shard]->read(t, elem, count, out);  // t is a copy of the shard's own entry
  bytes_read_ += count * dtype_size(t.dtype);
}

hf::WeightCheck HfModelDir::compare(const hf::WantedTensors& wanted) const {
  std::vector<hf::FoundTensor> found;
  found.reserve(tensors_.size() + others_.size());
  for (const auto& t : tensors_) {
    found.push_back({t.name, t.shape, t.dtype == DType::fp32 ? "F32" : t.dtype == DType::bf16 ? "BF16" : "F16"});
  }
  for (const auto& t : others_) found.push_back({t.name, t.shape, t.dtype});
  return hf::compare_weights(wanted, found);
}

void HfModelDir::check(const hf::WantedTensors& wanted) const {
  const auto c = compare(wanted);
  STRATA_CHECK(c.ok(), Errc::invalid_argument, c.message("'" + dir_ + "'"));
}

}  // namespace strata::model
