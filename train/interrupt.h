// Ctrl-C for commands that own files on disk (swap files, bench files): while an
// InterruptScope lives, SIGINT, SIGTERM and SIGHUP only set a flag, and the command's loop
// calls check_interrupted() between steps, which throws, so the owners' destructors remove
// what they created before the command exits. A second signal ends the process at once
// (the swap directory's lock lets the next run remove what it left). Commands that create
// files open the scope first, so a signal during their setup is handled the same way.
#pragma once

namespace strata::train {

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
// The signal that arrived under the last scope, or 0: main() exits with 128 + it (130 for
// SIGINT, 143 for SIGTERM), as a shell reports a process the signal killed.
int interrupt_signal() noexcept;

}  // namespace strata::train
