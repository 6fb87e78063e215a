// The room a save that hard-links a run's swap files needs (checkpoint/directory.h's saves;
// the engine's NVMe optimizer state). A linked file shares its blocks with the run, and the
// run writes a linked file again only under a new inode, the checkpoint keeping the old
// blocks. So every run file that will still have a link outside the run after this save (the
// current generation the save links, and files earlier saves linked that retention keeps)
// needs its size anew on the swap directory's filesystem within two steps, against what is
// free now plus what this save's retention frees (checkpoint files nothing else links).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata::checkpoint {

struct LinkedRun {
  std::string swap_dir;                     // where the run's swap files live
  std::vector<std::string> run_files;       // every swap file of the run (committed and spare)
  std::vector<std::string> linked_by_save;  // the files this save links
};

// Refuses (Errc::out_of_budget, naming the bytes, the directories and what to do) a save of
// `step` under `root` by `rank`, keeping `keep` checkpoints, whose links the swap directory's
// filesystem lacks room for. Nothing to check when the checkpoint is on another filesystem
// (the files are copied there) or the save links nothing new.
void check_link_space(const std::string& root, std::int64_t step, int keep, int rank, const LinkedRun& run);

}  // namespace strata::checkpoint
