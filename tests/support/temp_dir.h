// A scratch directory removed (recursively) when the owner goes away. Created under
// $STRATA_TEST_TMPDIR, else /var/tmp (a disk, so O_DIRECT works; /tmp may be tmpfs).
#pragma once

#include <string>

namespace strata::test {

class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "strata-test");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const noexcept { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace strata::test
