// The local launcher (see launch.h): fork/exec per rank in its own process group, one pipe
// per rank for stdout+stderr, a poll loop that forwards whole lines, reaps children and
// escalates termination after a failure.
#include "runtime/comm/launch.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "runtime/core/error.h"

namespace strata::comm {
namespace {

using Clock = std::chrono::steady_clock;
std::atomic<int> g_forward_signal{0};

void on_signal(int sig) { g_forward_signal.store(sig); }

struct Child {
  int rank;
  pid_t pid = -1;
  int fd = -1;
  std::string partial;
  bool exited = false;
  RankExit exit;
};

void write_all(int fd, const std::string& s) {
  std::size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::write(fd, s.data() + off, s.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    off += static_cast<std::size_t>(n);
  }
}

std::string describe_exit(const RankExit& e) {
  if (e.signal != 0) {
    const char* name = sigabbrev_np(e.signal);
    return str_cat("rank ", e.rank, " (pid ", e.pid, ") was killed by signal ", e.signal, name ? " (SIG" : "",
                   name ? name : "", name ? ")" : "");
  }
  return str_cat("rank ", e.rank, " (pid ", e.pid, ") exited with code ", e.exit_code);
}

pid_t spawn(const LaunchOptions& o, int rank, const std::string& rdzv, const std::string& run_id, int out_fd) {
  const pid_t pid = fork();
  STRATA_CHECK(pid >= 0, Errc::io, "strata launch: fork for rank ", rank, " failed: ", errno_text(errno));
  if (pid > 0) return pid;
  // Child: own process group (so the launcher can stop its whole tree), output to the pipe.
  setpgid(0, 0);
  dup2(out_fd, STDOUT_FILENO);
  dup2(out_fd, STDERR_FILENO);
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  setenv("STRATA_RANK", std::to_string(o.node_rank * o.nprocs + rank).c_str(), 1);
  setenv("STRATA_LOCAL_RANK", std::to_string(rank).c_str(), 1);
  setenv("STRATA_WORLD_SIZE", std::to_string(o.nnodes * o.nprocs).c_str(), 1);
  setenv("STRATA_RENDEZVOUS", ("file://" + rdzv).c_str(), 1);
  setenv("STRATA_RUN_ID", run_id.c_str(), 1);
  for (const auto& [k, v] : o.env) setenv(k.c_str(), v.c_str(), 1);
  std::vector<char*> argv;
  for (const auto& a : o.command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  const std::string msg = "strata launch: cannot run '" + o.command[0] + "': " + errno_text(errno) + "\n";
  write_all(STDERR_FILENO, msg);
  _exit(127);
}

}  // namespace

namespace {

// Reads what the ranks printed (up to 50 ms), forwarding whole lines with their prefix.
void pump_output(std::vector<Child>& children, const LaunchOptions& o) {
  auto emit = [&](Child& c, const std::string& line) {
    if (o.capture) c.exit.output += line;
    if (o.only_rank_output >= 0 && o.only_rank_output != c.rank) return;
    write_all(STDOUT_FILENO, o.prefix_output ? "[rank " + std::to_string(c.rank) + "] " + line : line);
  };
  std::vector<pollfd> fds;
  std::vector<Child*> owners;
  for (auto& c : children) {
    if (c.fd >= 0) {
      fds.push_back({c.fd, POLLIN, 0});
      owners.push_back(&c);
    }
  }
  ::poll(fds.data(), fds.size(), 50);
  for (std::size_t i = 0; i < fds.size(); ++i) {
    if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    Child& c = *owners[i];
    char buf[65536];
    const ssize_t n = ::read(c.fd, buf, sizeof buf);
    if (n > 0) {
      c.partial.append(buf, static_cast<std::size_t>(n));
      std::size_t nl;
      while ((nl = c.partial.find('\n')) != std::string::npos) {
        emit(c, c.partial.substr(0, nl + 1));
        c.partial.erase(0, nl + 1);
      }
    } else if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) {
      if (!c.partial.empty()) emit(c, c.partial + "\n");
      c.partial.clear();
      ::close(c.fd);
      c.fd = -1;
    }
  }
}

// Collects ranks that exited; the first to fail unasked is named and starts the grace
// period after which the others are stopped (term_at).
void reap(std::vector<Child>& children, const LaunchOptions& o, LaunchResult& result, Clock::time_point& term_at) {
  for (auto& c : children) {
    if (c.exited) continue;
    int status = 0;
    const pid_t w = waitpid(c.pid, &status, WNOHANG);
    if (w != c.pid) continue;
    c.exited = true;
    if (WIFSIGNALED(status))
      c.exit.signal = WTERMSIG(status);
    else
      c.exit.exit_code = WEXITSTATUS(status);
    const bool failed = c.exit.signal != 0 || c.exit.exit_code != 0;
    if (failed && result.failed_rank < 0 && !c.exit.terminated_by_launcher) {
      result.failed_rank = c.rank;
      result.summary = describe_exit(c.exit);
      write_all(STDERR_FILENO, "strata launch: " + result.summary + "; stopping the other ranks in " +
                                   std::to_string(o.grace.count()) + " ms\n");
      term_at = Clock::now() + o.grace;
    }
  }
}

}  // namespace

LaunchResult launch_local(const LaunchOptions& o) {
  STRATA_CHECK(o.nprocs >= 1, Errc::invalid_argument, "strata launch: -n ", o.nprocs, " must be at least 1");
  STRATA_CHECK(!o.command.empty(), Errc::invalid_argument,
               "strata launch: no command given (strata launch -n N -- CMD ARGS)");
  STRATA_CHECK(o.nnodes >= 1 && o.node_rank >= 0 && o.node_rank < o.nnodes, Errc::invalid_argument,
               "strata launch: --node-rank ", o.node_rank, " is not a node of --nnodes ", o.nnodes);
  STRATA_CHECK(o.nnodes == 1 || (!o.rendezvous_dir.empty() && !o.run_id.empty()), Errc::invalid_argument,
               "strata launch: --nnodes ", o.nnodes,
               " needs --rendezvous DIR on a filesystem every node shares and the same --run-id on every node "
               "(for example $SLURM_JOB_ID)");
  const char* tmp = std::getenv("TMPDIR");
  const std::string base = !o.rendezvous_dir.empty() ? o.rendezvous_dir : (tmp && *tmp ? tmp : "/tmp");
  const std::string run_id =
      !o.run_id.empty() ? o.run_id : str_cat("launch-", getpid(), "-", Clock::now().time_since_epoch().count());
  const std::string rdzv = base + "/strata-rdzv-" + run_id;
  std::error_code ec;
  std::filesystem::create_directories(rdzv, ec);
  STRATA_CHECK(!ec, Errc::io, "strata launch: rendezvous directory '", rdzv, "' cannot be created: ", ec.message(),
               ". Pass --rendezvous DIR with a writable directory");

  struct sigaction sa {
  }, old_int{}, old_term{};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  g_forward_signal.store(0);

  std::vector<Child> children(o.nprocs);
  for (int r = 0; r < o.nprocs; ++r) {
    int p[2];
    STRATA_SYS_CHECK(pipe2(p, O_CLOEXEC), "strata launch: pipe for rank ", r);
    children[r].rank = r;
    children[r].pid = spawn(o, r, rdzv, run_id, p[1]);
    ::close(p[1]);
    children[r].fd = p[0];
    children[r].exit.rank = r;
    children[r].exit.pid = children[r].pid;
  }

  LaunchResult result;
  constexpr auto kNever = Clock::time_point::max();
  Clock::time_point term_at = kNever, kill_at = kNever;
  auto alive = [&] {
    for (auto& c : children) {
      if (!c.exited || c.fd >= 0) return true;
    }
    return false;
  };
  while (alive()) {
    pump_output(children, o);
    reap(children, o, result, term_at);
    // Forward Ctrl-C / SIGTERM to every rank's process group.
    if (const int sig = g_forward_signal.exchange(0)) {
      for (auto& c : children) {
        if (!c.exited) kill(-c.pid, sig);
      }
      if (term_at == kNever) term_at = Clock::now() + o.grace;
    }
    const auto now = Clock::now();
    if (now >= term_at) {
      for (auto& c : children) {
        if (!c.exited) {
          c.exit.terminated_by_launcher = true;
          kill(-c.pid, SIGTERM);
        }
      }
      term_at = kNever;
      kill_at = now + std::chrono::seconds(3);
    }
    if (now >= kill_at) {
      for (auto& c : children) {
        if (!c.exited) kill(-c.pid, SIGKILL);
      }
      kill_at = kNever;
    }
  }
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  if (o.nnodes == 1) std::filesystem::remove_all(rdzv, ec);  // other nodes may still read theirs

  for (auto& c : children) result.ranks.push_back(c.exit);
  if (result.failed_rank >= 0) {
    const auto& e = result.ranks[result.failed_rank];
    result.exit_code = e.signal != 0 ? 128 + e.signal : e.exit_code;
  } else {
    for (const auto& e : result.ranks) {
      if (e.signal != 0 || e.exit_code != 0) {
        result.exit_code = e.signal != 0 ? 128 + e.signal : e.exit_code;
        result.failed_rank = e.rank;
        result.summary = describe_exit(e);
        break;
      }
    }
  }
  return result;
}

}  // namespace strata::comm
