// Atomic commit, `latest`, retention and opening of checkpoint directories (directory.h).
#include "checkpoint/directory.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <optional>
#include <system_error>
#include <utility>

#include "runtime/core/error.h"
#include "runtime/core/log.h"

namespace strata::checkpoint {
namespace fs = std::filesystem;
namespace {

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  STRATA_CHECK(fd >= 0, Errc::io, "checkpoint: cannot open '", path, "' to fsync it: ", errno_text(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  STRATA_CHECK(rc == 0, Errc::io, "checkpoint: fsync of '", path, "' failed: ", errno_text(err));
}

// Writes `text` to dir/name through dir/name.tmp: write, fsync, rename, fsync dir.
void write_atomically(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string tmp = dir + "/" + name + ".tmp", path = dir + "/" + name;
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  STRATA_CHECK(fd >= 0, Errc::io, "checkpoint: cannot create '", tmp, "': ", errno_text(errno));
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : ENOSPC;
      ::close(fd);
      ::unlink(tmp.c_str());
      STRATA_THROW(Errc::io, "checkpoint: writing '", tmp, "' failed: ", errno_text(err),
                   " (a full disk? free space; the previous checkpoint is kept)");
    }
    done += static_cast<std::size_t>(n);
  }
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) {
    ::unlink(tmp.c_str());
    STRATA_THROW(Errc::io, "checkpoint: fsync of '", tmp, "' failed: ", errno_text(err));
  }
  STRATA_CHECK(::rename(tmp.c_str(), path.c_str()) == 0, Errc::io, "checkpoint: rename '", tmp, "' -> '", path,
               "' failed: ", errno_text(errno));
  fsync_path(dir, true);
}

// Bounds on the control files: `latest` holds one directory name; a manifest is about 100
// bytes per segment, so 256 MiB is millions of segments, far past any model's.
constexpr std::uint64_t kMaxLatestBytes = 4096;
constexpr std::uint64_t kMaxManifestBytes = std::uint64_t{256} << 20;

const char* file_type_name(mode_t mode) {
  switch (mode & S_IFMT) {
    case S_IFIFO:
      return "a FIFO";
    case S_IFCHR:
      return "a character device";
    case S_IFBLK:
      return "a block device";
    case S_IFDIR:
      return "a directory";
    case S_IFSOCK:
      return "a socket";
    default:
      return "not a regular file";
  }
}

// Reads a control file (`latest`, a manifest) whole. Opened non-blocking and checked to be
// a regular file of at most `max_bytes` before a byte is read, so a FIFO cannot hang the
// open and /dev/zero cannot grow the read without bound; exactly st_size bytes are read.
std::string read_control_file(const std::string& path, std::uint64_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  STRATA_CHECK(fd >= 0, Errc::io, "checkpoint: cannot open '", path, "': ", errno_text(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  STRATA_SYS_CHECK(::fstat(fd, &st), "checkpoint: cannot stat '", path, "'");
  STRATA_CHECK(S_ISREG(st.st_mode), Errc::corrupt, "checkpoint: '", path, "' is ", file_type_name(st.st_mode),
               ", not a regular file: a save only ever writes a plain file there; load another checkpoint");
  const auto size = static_cast<std::uint64_t>(st.st_size);
  STRATA_CHECK(size <= max_bytes, Errc::corrupt, "checkpoint: '", path, "' holds ", size, " bytes, more than the ",
               max_bytes, " a save ever writes there: it is not a checkpoint's file; load another checkpoint");
  std::string text(size, '\0');
  std::size_t done = 0;
  while (done < size) {
    const ssize_t n = ::read(fd, text.data() + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    STRATA_CHECK(n > 0, Errc::io, "checkpoint: reading '", path, "' stopped at byte ", done, " of ", size, ": ",
                 n < 0 ? errno_text(errno) : std::string("the file shrank while it was read"));
    done += static_cast<std::size_t>(n);
  }
  return text;
}

// Whether `p` names anything, a dangling symbolic link included.
bool entry_exists(const std::string& p) {
  struct stat st {};
  return ::lstat(p.c_str(), &st) == 0;
}

bool is_dir(const std::string& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);
}

void remove_tree(const std::string& p) noexcept {
  std::error_code ec;
  fs::remove_all(p, ec);
  if (ec) STRATA_LOG(warn, "checkpoint: could not remove '", p, "': ", ec.message());
}

// A step directory's checkpoint: its manifest read bounded, checksum, fields and tiling checked.
Opened open_step_dir(const std::string& dir) {
  const std::string path = dir + "/" + kManifestName;
  Opened o;
  o.dir = dir;
  o.manifest = parse_manifest_file(read_control_file(path, kMaxManifestBytes), path);
  return o;
}

// The checkpoint `latest` names under root; throws saying why it cannot be used. `named`
// receives the step directory's name once `latest` has given one.
// The step directory `latest` names; throws when `latest` itself cannot be used.
std::string latest_dir(const std::string& root, std::string& named) {
  const std::string p = root + "/" + kLatestName;
  STRATA_CHECK(entry_exists(p), Errc::invalid_argument, "no checkpoint in '", root, "': it has no '", kLatestName,
               "' file (no save has completed there)");
  std::string name = read_control_file(p, kMaxLatestBytes);
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  STRATA_CHECK(!name.empty(), Errc::corrupt, "checkpoint '", p, "' is empty: it names no step directory");
  if (step_of_dir_name(name) < 0) {
    std::string shown = name.substr(0, 200);  // one line, however damaged the file is
    std::replace_if(
        shown.begin(), shown.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20; }, '?');
    STRATA_THROW(Errc::corrupt, "checkpoint '", p, "' names '", shown, "', which is not a step directory");
  }
  named = name;
  STRATA_CHECK(entry_exists(root + "/" + name), Errc::corrupt, "checkpoint '", p, "' names ", name,
               ", which does not exist");
  return root + "/" + name;
}

// The newest step directory under root (but `skip`) whose manifest reads and validates.
std::optional<Opened> newest_complete(const std::string& root, const std::string& skip) {
  std::vector<std::pair<std::int64_t, std::string>> steps;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string n = e.path().filename().string();
    if (step_of_dir_name(n) >= 0 && n != skip && is_dir(e.path().string())) steps.emplace_back(step_of_dir_name(n), n);
  }
  std::sort(steps.rbegin(), steps.rend());
  for (const auto& s : steps) {
    try {
      return open_step_dir(root + "/" + s.second);
    } catch (const Error& e) {
      STRATA_LOG(debug, "checkpoint: ", s.second, " is not complete: ", e.what());
    }
  }
  return std::nullopt;
}

}  // namespace

std::string staging_dir(const std::string& root, std::int64_t step) {
  return root + "/." + step_dir_name(step) + ".tmp";
}

std::string prepare_save(const std::string& root, std::int64_t step) {
  std::error_code ec;
  fs::create_directories(root, ec);
  STRATA_CHECK(!ec && is_dir(root), Errc::io, "checkpoint: save directory '", root,
               "' cannot be created: ", ec ? ec.message() : "a file of that name exists",
               " (give --save-dir a writable directory)");
  // The root's own entry must be durable before a commit inside it can be: its parent is
  // fsynced (ext4 and xfs persist it with the journal's next commit anyway; POSIX does not
  // promise that, and a power loss could otherwise take the whole directory).
  const fs::path parent = fs::absolute(fs::path(root)).lexically_normal().parent_path();
  if (!parent.empty()) fsync_path(parent.string(), true);
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string n = e.path().filename().string();
    if (n.size() > 5 && n[0] == '.' && n.compare(1, 5, "step-") == 0) remove_tree(e.path().string());
  }
  const std::string tmp = staging_dir(root, step);
  STRATA_CHECK(fs::create_directory(tmp, ec) && !ec, Errc::io, "checkpoint: cannot create '", tmp,
               "': ", ec ? ec.message() : "it exists");
  return tmp;
}

void abandon_save(const std::string& root, std::int64_t step) noexcept { remove_tree(staging_dir(root, step)); }

std::vector<std::int64_t> list_checkpoints(const std::string& root) {
  std::vector<std::int64_t> steps;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::int64_t s = step_of_dir_name(e.path().filename().string());
    if (s >= 0 && fs::exists(e.path() / kManifestName, ec)) steps.push_back(s);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

std::string commit_save(const std::string& root, const Manifest& manifest, int keep) {
  const std::string tmp = staging_dir(root, manifest.step), name = step_dir_name(manifest.step);
  const std::string final_dir = root + "/" + name;
  for (const auto& f : manifest.files) fsync_path(tmp + "/" + f.name, false);
  write_atomically(tmp, kManifestName, manifest_file_text(manifest));
  if (is_dir(final_dir)) {
    // A checkpoint of this step exists (a run resumed from an earlier one): swap them in
    // one step, so the name always holds a complete checkpoint, then drop the old one.
    STRATA_CHECK(::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0, Errc::io,
                 "checkpoint: exchanging '", tmp, "' with '", final_dir, "' failed: ", errno_text(errno));
    fsync_path(root, true);
    remove_tree(tmp);
  } else {
    STRATA_CHECK(::rename(tmp.c_str(), final_dir.c_str()) == 0, Errc::io, "checkpoint: rename '", tmp, "' -> '",
                 final_dir, "' failed: ", errno_text(errno));
    fsync_path(root, true);
  }
  write_atomically(root, kLatestName, name + "\n");
  if (keep > 0) {
    auto steps = list_checkpoints(root);
    const std::int64_t latest = step_of_dir_name(name);
    for (std::size_t i = 0; i + static_cast<std::size_t>(keep) < steps.size(); ++i) {
      if (steps[i] == latest) continue;
      const std::string old = root + "/" + step_dir_name(steps[i]);
      const std::string away = root + "/." + step_dir_name(steps[i]) + ".old";
      if (::rename(old.c_str(), away.c_str()) == 0) remove_tree(away);
    }
  }
  return final_dir;
}

Opened open_checkpoint(const std::string& path) {
  STRATA_CHECK(is_dir(path), Errc::invalid_argument, "checkpoint '", path,
               "' is not a directory: give a save directory (it follows 'latest') or one of its step-N directories");
  // A step directory (it has a manifest, or a step name and no `latest`) is the checkpoint
  // the caller chose: it is read as it is and never replaced by another.
  const bool has_manifest = entry_exists(path + "/" + kManifestName);
  if (has_manifest ||
      (step_of_dir_name(fs::path(path).filename().string()) >= 0 && !entry_exists(path + "/" + kLatestName))) {
    STRATA_CHECK(has_manifest, Errc::corrupt, "checkpoint '", path, "' has no ", kManifestName,
                 ": the save that wrote it did not complete; load another checkpoint");
    return open_step_dir(path);
  }
  // Only a `latest` that cannot be used falls back (missing, empty, torn, not a regular
  // file, naming no step or a step that is gone): a power loss or a hand edit. What it names
  // is read as it is: a damaged checkpoint is an error, never quietly replaced by an older
  // one, and neither is a failing read (an I/O error may pass; a fallback would not).
  std::string named, dir;
  try {
    dir = latest_dir(path, named);
  } catch (const Error& e) {
    if (e.code() == Errc::io) throw;
    auto found = newest_complete(path, named);
    if (!found) throw;
    STRATA_LOG(warn, "checkpoint: not using '", kLatestName, "' under '", path, "' (", e.what(), "); loading ",
               fs::path(found->dir).filename().string(), " (step ", found->manifest.step,
               "), the newest complete checkpoint there");
    return std::move(*found);
  }
  STRATA_CHECK(entry_exists(dir + "/" + kManifestName), Errc::corrupt, "checkpoint '", path, "/", kLatestName,
               "' names ", named, ", which has no ", kManifestName,
               ": it was damaged after its save; load another checkpoint by its step directory");
  return open_step_dir(dir);
}

}  // namespace strata::checkpoint
