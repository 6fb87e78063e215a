// See interrupt.h.
#include "train/interrupt.h"

#include <csignal>

#include "runtime/core/error.h"

namespace strata::train {
namespace {

volatile std::sig_atomic_t g_signal = 0;
struct sigaction g_old[3];
constexpr int kSignals[3] = {SIGINT, SIGTERM, SIGHUP};

extern "C" void note_signal(int sig) {
  g_signal = sig;
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, nullptr);  // the next one ends the process
}

}  // namespace

InterruptScope::InterruptScope() {
  g_signal = 0;
  struct sigaction sa {};
  sa.sa_handler = note_signal;
  sa.sa_flags = SA_RESTART;  // reads (a child bench's pipe) and waits go on; the loop checks the flag
  sigemptyset(&sa.sa_mask);
  for (int i = 0; i < 3; ++i) sigaction(kSignals[i], &sa, &g_old[i]);
}

InterruptScope::~InterruptScope() {
  for (int i = 0; i < 3; ++i) sigaction(kSignals[i], &g_old[i], nullptr);
}

bool interrupt_pending() noexcept { return g_signal != 0; }

int interrupt_signal() noexcept { return static_cast<int>(g_signal); }

void check_interrupted(const char* what) {
  if (g_signal != 0) {
    STRATA_THROW(Errc::invalid_argument, what, ": interrupted by signal ", static_cast<int>(g_signal),
                 "; its files were removed");
  }
}

}  // namespace strata::train
