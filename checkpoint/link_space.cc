// check_link_space (link_space.h): the run's swap files and the checkpoints retention
// removes, counted by inode on the checkpoint's filesystem.
#include "checkpoint/link_space.h"

#include <sys/stat.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "checkpoint/directory.h"
#include "checkpoint/format.h"
#include "runtime/core/error.h"
#include "runtime/core/units.h"

namespace strata::checkpoint {

void check_link_space(const std::string& root, std::int64_t step, int keep, int rank, const LinkedRun& run) {
  struct stat dir_st {
  }, swap_st{};
  if (::stat(staging_dir(root, step).c_str(), &dir_st) != 0 || ::stat(run.swap_dir.c_str(), &swap_st) != 0 ||
      dir_st.st_dev != swap_st.st_dev)
    return;
  using Inode = std::pair<dev_t, ino_t>;
  struct File {
    std::uint64_t bytes = 0, links = 0, gone = 0;  // on disk, st_nlink, links retention removes
  };
  std::map<Inode, File> files;
  // Records the file at `path` (on the checkpoint's filesystem) and returns its inode.
  auto look = [&](const std::string& path) -> std::optional<Inode> {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 || st.st_dev != dir_st.st_dev) return std::nullopt;
    File& f = files[{st.st_dev, st.st_ino}];
    f.bytes = static_cast<std::uint64_t>(st.st_blocks) * 512;
    f.links = st.st_nlink;
    return Inode{st.st_dev, st.st_ino};
  };
  // The checkpoints retention removes once this save commits: commit_save's rule, this step latest.
  if (keep > 0) {
    auto steps = list_checkpoints(root);
    if (std::find(steps.begin(), steps.end(), step) == steps.end()) steps.push_back(step);
    std::sort(steps.begin(), steps.end());
    const std::string mine = shard_file_name(rank).substr(0, 10);  // "rank00003."
    for (std::size_t i = 0; i + static_cast<std::size_t>(keep) < steps.size(); ++i) {
      if (steps[i] == step) continue;
      std::error_code ec;
      for (const auto& e : std::filesystem::directory_iterator(root + "/" + step_dir_name(steps[i]), ec)) {
        const std::string n = e.path().filename().string();
        if (n.rfind(mine, 0) != 0 || e.path().extension() != ".swap") continue;
        if (const auto inode = look(e.path().string())) ++files[*inode].gone;
      }
    }
  }
  std::set<Inode> in_run, linked_now;
  for (const auto& p : run.run_files)
    if (const auto inode = look(p)) in_run.insert(*inode);
  for (const auto& p : run.linked_by_save)
    if (const auto inode = look(p)) linked_now.insert(*inode);
  std::uint64_t needed = 0, freed = 0, linking = 0;
  for (const auto& [inode, f] : files) {
    const bool now = linked_now.count(inode) != 0;
    if (in_run.count(inode) != 0) {
      const std::uint64_t outside = f.links - 1 - f.gone + (now ? 1 : 0);  // links beside the run's own
      if (outside > 0) needed += f.bytes;
      if (now && f.links == 1) linking += f.bytes;
    } else if (f.gone == f.links) {
      freed += f.bytes;  // only checkpoints retention removes hold it
    }
  }
  if (linking == 0) return;  // this save shares nothing new
  struct statvfs vfs {};
  if (::statvfs(run.swap_dir.c_str(), &vfs) != 0) return;
  const std::uint64_t free_bytes = static_cast<std::uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  STRATA_CHECK(free_bytes + freed >= needed, Errc::out_of_budget, "rank ", rank, ": the checkpoint in '", root,
               "' would hard-link ", format_bytes(linking), " of NVMe optimizer state that training rewrites within ",
               "two steps; the run's linked swap files then need ", format_bytes(needed),
               " more on the filesystem of '", run.swap_dir, "', and only ", format_bytes(free_bytes), " is free",
               freed > 0 ? str_cat(" (", format_bytes(freed), " more once --keep ", keep, " removes older checkpoints)")
                         : std::string(),
               ": free space there, keep fewer checkpoints (--keep), or save checkpoints on another "
               "filesystem (the state is copied there)");
}

}  // namespace strata::checkpoint
