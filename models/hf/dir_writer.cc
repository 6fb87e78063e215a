// Writing a Hugging Face model directory (see dir_writer.h).
#include "models/hf/dir_writer.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "models/hf/format.h"
#include "runtime/core/error.h"

namespace strata::model {
namespace {

std::string parent_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// The names HfDirWriter creates in OUT.tmp (SafetensorsWriter's own `.tmp` files too): only
// a directory of these is taken for a leftover of a killed writer and removed.
bool writer_file(std::string name) {
  if (name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0) name.resize(name.size() - 4);
  if (name == hf::kConfigName || name == hf::kIndexName || name == hf::kSingleName) return true;
  unsigned a = 0, b = 0;
  int used = 0;
  return std::sscanf(name.c_str(), "model-%5u-of-%5u.safetensors%n", &a, &b, &used) == 2 &&
         static_cast<std::size_t>(used) == name.size();
}

// The entries of directory `path` other than . and .. (empty when it cannot be read).
std::vector<std::string> entries_of(const std::string& path) {
  std::vector<std::string> out;
  DIR* d = ::opendir(path.c_str());
  if (d == nullptr) return out;
  while (const dirent* e = ::readdir(d)) {
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) out.emplace_back(e->d_name);
  }
  ::closedir(d);
  return out;
}

void fsync_dir(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  STRATA_CHECK(fd >= 0, Errc::io, "cannot open directory '", path, "' to fsync it: ", errno_text(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  STRATA_CHECK(rc == 0, Errc::io, "fsync of directory '", path, "' failed: ", errno_text(err));
}

}  // namespace

HfDirWriter::HfDirWriter(std::string out_dir, const std::string& config_json_text, const Tensors& tensors, DType dtype,
                         std::uint64_t max_shard_bytes, const std::map<std::string, std::string>& metadata)
    : out_(std::move(out_dir)), metadata_(metadata) {
  while (out_.size() > 1 && out_.back() == '/') out_.pop_back();
  STRATA_CHECK(!out_.empty() && out_ != "/", Errc::invalid_argument, "the output directory '", out_,
               "' cannot be written: give a new directory's path");
  tmp_ = out_ + ".tmp";
  // config.json: the caller's object, in its key order, with the dtype the weights now have.
  nlohmann::ordered_json config;
  try {
    config = nlohmann::ordered_json::parse(config_json_text);
  } catch (const nlohmann::json::exception& e) {
    STRATA_THROW(Errc::invalid_argument, "'", out_, "': the model's config.json text is not JSON (", e.what(), ")");
  }
  STRATA_CHECK(config.is_object(), Errc::invalid_argument, "'", out_, "': the model's config.json text is a JSON ",
               config.type_name(), ", not an object");
  config["torch_dtype"] = hf::torch_dtype_name(dtype);
  if (config.contains("dtype")) config["dtype"] = hf::torch_dtype_name(dtype);  // transformers >= 4.56's key
  config_text_ = config.dump(2) + "\n";
  // The shards, planned from the shapes.
  std::set<std::string> names;
  std::vector<std::uint64_t> bytes;
  for (const auto& [name, shape] : tensors) {
    STRATA_CHECK(!name.empty() && name != "__metadata__" && names.insert(name).second, Errc::invalid_argument, "'",
                 out_, "': tensor name '", name, "' ",
                 name.empty()             ? "is empty"
                 : name == "__metadata__" ? "is reserved"
                                          : "is given twice",
                 ": each tensor needs a name of its own");
    std::uint64_t numel = 1;
    for (auto d : shape) {
      STRATA_CHECK(d >= 0, Errc::invalid_argument, "'", out_, "': tensor '", name, "' has a negative dimension");
      numel *= static_cast<std::uint64_t>(d);
    }
    bytes.push_back(numel * dtype_size(dtype));
    total_bytes_ += bytes.back();
  }
  const auto plan = hf::plan_shards(bytes, max_shard_bytes);
  const std::size_t count = plan.empty() ? 1 : plan.back() + 1;
  shards_.resize(count);
  shard_numel_.resize(count);
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    shards_[plan[i]].push_back({tensors[i].first, dtype, tensors[i].second});
    shard_numel_[plan[i]] += bytes[i] / dtype_size(dtype);
  }
  for (std::size_t s = 0; s < count; ++s)
    shard_names_.push_back(count == 1 ? hf::kSingleName : hf::shard_file_name(s, count));
  for (std::size_t i = 0; i < tensors.size(); ++i) weight_map_[tensors[i].first] = shard_names_[plan[i]];
  metadata_["format"] = "pt";
  // OUT: absent or an empty directory (see the output rule in dir_writer.h).
  struct stat st {};
  if (::lstat(out_.c_str(), &st) == 0) {
    // A link, even to an empty directory, is refused: the rename would fail on it at the end.
    STRATA_CHECK(S_ISDIR(st.st_mode), Errc::invalid_argument, "'", out_, "' exists and is ",
                 S_ISLNK(st.st_mode) ? "a symbolic link" : "not a directory",
                 ": give a new directory's path for the Hugging Face model");
    const auto there = entries_of(out_);
    STRATA_CHECK(there.empty(), Errc::invalid_argument, "'", out_, "' exists and is not empty (it holds '",
                 there.empty() ? "" : there.front(), "'",
                 there.size() > 1 ? str_cat(" and ", there.size() - 1, " more") : "",
                 "): give a new directory, or remove that one first; nothing is overwritten");
  }
  prepare_tmp();
  try {
    open_shard();
    close_finished_shards();
  } catch (...) {
    remove_tmp();  // the destructor does not run for a constructor that throws
    throw;
  }
}

HfDirWriter::~HfDirWriter() {
  if (!finished_) remove_tmp();
}

void HfDirWriter::prepare_tmp() {
  struct stat st {};
  if (::lstat(tmp_.c_str(), &st) == 0) {
    STRATA_CHECK(S_ISDIR(st.st_mode), Errc::invalid_argument, "'", tmp_,
                 "' exists and is not a directory, and the export writes there first: remove it or choose another "
                 "output directory");
    for (const auto& e : entries_of(tmp_)) {
      STRATA_CHECK(writer_file(e), Errc::invalid_argument, "'", tmp_, "' exists and holds '", e,
                   "', which an interrupted export does not leave: the directory is not a leftover of this writer; "
                   "remove it or choose another output directory");
    }
    remove_tmp();  // a killed writer's leftover
  }
  if (::mkdir(tmp_.c_str(), 0755) != 0) {
    const int err = errno;
    STRATA_CHECK(err != ENOENT, Errc::invalid_argument, "cannot create '", tmp_, "': the directory '", parent_of(out_),
                 "' does not exist");
    STRATA_THROW(Errc::io, "cannot create '", tmp_, "': ", errno_text(err));
  }
}

void HfDirWriter::open_shard() {
  writer_ = std::make_unique<SafetensorsWriter>(tmp_ + "/" + shard_names_[current_], shards_[current_], metadata_);
  written_ = 0;
}

// Finishes the current shard when its last tensor is complete and opens the next (a shard of
// empty tensors only is finished at once).
void HfDirWriter::close_finished_shards() {
  while (writer_ && written_ == shard_numel_[current_]) {
    writer_->finish();
    writer_.reset();
    if (++current_ < shards_.size()) open_shard();
  }
}

void HfDirWriter::write(const float* values, std::uint64_t count) {
  while (count > 0) {
    STRATA_CHECK(writer_ != nullptr, Errc::invalid_argument, "'", out_, "': ", count,
                 " values written past the last tensor");
    const std::uint64_t take = std::min(count, shard_numel_[current_] - written_);
    writer_->write(values, take);
    values += take;
    count -= take;
    written_ += take;
    close_finished_shards();
  }
}

void HfDirWriter::write_json(const std::string& name, const std::string& text) {
  const std::string path = tmp_ + "/" + name;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  STRATA_CHECK(fd >= 0, Errc::io, "cannot write '", path, "': ", errno_text(errno));
  std::size_t at = 0;
  int err = 0;
  while (at < text.size() && err == 0) {
    const ssize_t n = ::write(fd, text.data() + at, text.size() - at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      err = n < 0 ? errno : ENOSPC;
    else
      at += static_cast<std::size_t>(n);
  }
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  ::close(fd);
  STRATA_CHECK(err == 0, Errc::io, "writing '", path, "' failed: ", errno_text(err));
}

void HfDirWriter::finish() {
  STRATA_CHECK(!finished_, Errc::invalid_argument, "'", out_, "': finish() called twice");
  if (writer_ != nullptr) {
    std::uint64_t before = 0;  // elements of the shard's tensors before the one unfinished
    std::string name;
    for (const auto& t : shards_[current_]) {
      std::uint64_t numel = 1;
      for (auto d : t.shape) numel *= static_cast<std::uint64_t>(d);
      if (written_ < before + numel) {
        name = t.name;
        break;
      }
      before += numel;
    }
    STRATA_THROW(Errc::invalid_argument, "'", out_, "': tensor '", name, "' was not written whole (", written_ - before,
                 " of its values came): finish() needs every tensor's values");
  }
  if (shards_.size() > 1) {
    const nlohmann::json index = {{"metadata", {{"total_size", total_bytes_}}}, {"weight_map", weight_map_}};
    write_json(hf::kIndexName, index.dump(2) + "\n");
  }
  write_json(hf::kConfigName, config_text_);
  fsync_dir(tmp_);
  if (::rename(tmp_.c_str(), out_.c_str()) != 0) {
    const int err = errno;
    STRATA_THROW(
        Errc::io, "cannot move '", tmp_, "' to '", out_, "': ", errno_text(err),
        err == ENOTEMPTY || err == EEXIST ? " (it was filled while the export ran; nothing is overwritten)" : "");
  }
  finished_ = true;
  fsync_dir(parent_of(out_));
}

void HfDirWriter::remove_tmp() noexcept {
  writer_.reset();  // removes its own temporary file
  for (const auto& e : entries_of(tmp_)) {
    if (writer_file(e)) ::unlink((tmp_ + "/" + e).c_str());
  }
  ::rmdir(tmp_.c_str());
}

}  // namespace strata::model
