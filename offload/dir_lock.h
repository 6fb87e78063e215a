// Ownership of a rank's swap directory (<nvme_path>/rank<R>): a DirLock holds an exclusive
// flock on `.strata.lock` inside it for as long as the run uses the directory, so a second
// run on the same path is refused naming the holder's pid and host instead of the two
// corrupting each other's swap files. A directory whose lock is free but which still holds
// swap files belongs to a run that died without cleaning up (kill -9, power loss): those
// files are removed when the lock is taken, with one notice line saying how much. Only the
// run's own files go, told apart by place (the directory itself and its parameter-store
// subdirectories) and name (a generation "<stem>.a.swap" / ".b.swap" without a checkpoint's
// rank prefix): a checkpoint saved under the directory keeps every file. Released
// (lock file and the directories the lock created removed) on destruction, after the
// stores that lived in the directory are gone.
#pragma once

#include <string>
#include <vector>

namespace strata::offload {

class DirLock {
 public:
  // Creates `dir` when needed and locks it; `key` names the config key that chose it in
  // errors ("offload_optimizer.nvme_path"). Throws Errc::invalid_argument when another live
  // process holds it.
  DirLock(const std::string& dir, const char* key);
  ~DirLock();
  DirLock(DirLock&& other) noexcept;
  DirLock& operator=(DirLock&&) = delete;
  DirLock(const DirLock&) = delete;

  const std::string& dir() const noexcept { return dir_; }
  static constexpr const char* kFileName = ".strata.lock";

 private:
  void acquire(const std::string& path, const char* key);  // open and flock, retrying a replaced file

  std::string dir_;
  int fd_ = -1;
  std::vector<std::string> created_;  // directories this lock created, outermost first
};

}  // namespace strata::offload
