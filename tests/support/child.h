// Runs a test body in a forked child, for tests that change process-wide state the parent
// must keep (uid, mount namespace, rlimits). The child reports a string through a pipe;
// the parent gets it with the exit status. Fork only from a single-threaded moment (no
// Engine alive in the parent): the child gets only the calling thread.
#pragma once

#include <functional>
#include <string>

namespace strata::test {

struct ChildResult {
  int exit_code = -1;  // 0: the body returned; 2: it threw; -1: killed by a signal
  int signal = 0;
  std::string output;  // what the body returned, or the exception's text
};

ChildResult run_in_child(const std::function<std::string()>& body);

// In a child: a private mount namespace where this process may mount (tmpfs, ramfs).
// Tries unshare(CLONE_NEWNS) (needs CAP_SYS_ADMIN), then a user namespace mapping the
// current uid to root. Returns "" on success, else why not.
std::string enter_private_mount_namespace();

}  // namespace strata::test
