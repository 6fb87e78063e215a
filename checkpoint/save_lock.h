// SaveLock: one run at a time saves under a checkpoint root. Two runs sharing a --save-dir
// would remove each other's staging directories (prepare_save clears what crashed saves
// left) and race on `latest`. The first save of a run to a root takes an exclusive flock on
// `<root>/.strata-save.lock` and keeps it until the run ends (the engine holds it), so the
// second run's first save is refused naming the holder (pid and host). The kernel drops the
// lock when the holder dies, so a killed run never blocks the next one; the file stays (it
// is never removed, so two runs can never lock two different files of one name). Loading
// needs no lock: a committed checkpoint is never written.
#pragma once

#include <string>

namespace strata::checkpoint {

class SaveLock {
 public:
  inline static constexpr const char* kFileName = ".strata-save.lock";
  // Creates `root` if needed and locks it; throws Errc::invalid_argument naming the holder
  // when another run (or another engine of this process) holds it.
  explicit SaveLock(const std::string& root);
  ~SaveLock();
  SaveLock(const SaveLock&) = delete;
  SaveLock& operator=(const SaveLock&) = delete;

  const std::string& root() const noexcept { return root_; }

 private:
  std::string root_;
  int fd_ = -1;
};

}  // namespace strata::checkpoint
