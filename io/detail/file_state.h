// Internals shared by File, Engine and the reactor: the descriptors of an open file and the
// registry through which a File or buffer pool reaches its engine while the engine lives.
#pragma once

#include <memory>
#include <mutex>
#include <string>

namespace strata::io::detail {

class Reactor;

// Outlives the engine (held by Files and pools). reactor is cleared, under mutex, when the
// engine shuts down; whoever wants to release a slot locks mutex and checks it first.
struct Registry {
  std::mutex mutex;
  Reactor* reactor = nullptr;
};

struct FileState {
  std::string path;
  int fd = -1;           // primary descriptor: O_DIRECT when direct
  int buffered_fd = -1;  // same file without O_DIRECT (== fd when !direct)
  bool direct = false;
  int slot = -1;  // fixed-file slot of fd, or -1
  std::shared_ptr<Registry> registry;
  ~FileState();
};

}  // namespace strata::io::detail
