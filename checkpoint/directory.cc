// Atomic commit, `latest`, retention and opening of checkpoint directories (directory.h).
#include "checkpoint/directory.h"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

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

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  STRATA_CHECK(in.good(), Errc::io, "checkpoint: cannot read '", path, "': ", errno_text(errno));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
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

std::string latest_name(const std::string& root) {
  const std::string p = root + "/" + kLatestName;
  std::error_code ec;
  if (!fs::exists(p, ec)) return {};
  std::string name = read_file(p);
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  return name;
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
  write_atomically(tmp, kManifestName, to_json(manifest));
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
  std::string dir = path;
  std::error_code ec;
  if (!fs::exists(dir + "/" + kManifestName, ec)) {
    const std::string name = latest_name(path);
    if (name.empty()) {
      STRATA_CHECK(step_of_dir_name(fs::path(path).filename().string()) < 0, Errc::corrupt, "checkpoint '", path,
                   "' has no ", kManifestName, ": the save that wrote it did not complete; load another checkpoint");
      STRATA_THROW(Errc::invalid_argument, "no checkpoint in '", path, "': it has no '", kLatestName,
                   "' file (no save has completed there)");
    }
    STRATA_CHECK(step_of_dir_name(name) >= 0, Errc::corrupt, "checkpoint '", path, "/", kLatestName, "' names '", name,
                 "', which is not a step directory");
    dir = path + "/" + name;
    STRATA_CHECK(fs::exists(dir + "/" + kManifestName, ec), Errc::corrupt, "checkpoint '", path, "/", kLatestName,
                 "' names ", name, ", which has no ", kManifestName);
  }
  Opened o;
  o.dir = dir;
  o.manifest = parse_manifest(read_file(dir + "/" + kManifestName), dir + "/" + kManifestName);
  return o;
}

}  // namespace strata::checkpoint
