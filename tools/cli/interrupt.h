// Ctrl-C for commands that own files on disk (swap files, bench files): while an
// InterruptScope lives, SIGINT, SIGTERM and SIGHUP only set a flag, and the command's loop
// calls check_interrupted() between steps, which throws, so the owners' destructors remove
// what they created before the command exits. A second signal ends the process at once.
#pragma once

namespace strata::cli {

class InterruptScope {
 public:
  InterruptScope();
  ~InterruptScope();
  InterruptScope(const InterruptScope&) = delete;
  InterruptScope& operator=(const InterruptScope&) = delete;
};

// Throws strata::Error naming `what` if a signal arrived since the scope began.
void check_interrupted(const char* what);
// Whether a signal arrived (for a command that must act on it first, such as a final save).
bool interrupt_pending() noexcept;

}  // namespace strata::cli
