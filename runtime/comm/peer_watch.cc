// PeerWatch (see detail/peer_watch.h).
#include "runtime/comm/detail/peer_watch.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/core/host_memory.h"

namespace strata::comm::detail {
namespace {

// The state letter of /proc/PID/stat ('R', 'S', 'T' stopped, 'Z' zombie...); 0 when gone.
char process_state(long pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(in, text)) return 0;
  const auto close = text.rfind(')');  // the command name may hold spaces and parentheses
  return close != std::string::npos && close + 2 < text.size() ? text[close + 2] : 0;
}

}  // namespace

// "pid host [mark]", written by rename so that a reader never sees half a beacon.
std::error_code PeerWatch::write_beacon(const char* mark) const {
  const std::string mine = prefix_ + std::to_string(rank_), tmp = mine + ".tmp";
  std::ofstream(tmp) << ::getpid() << " " << host_name() << " " << mark << "\n";
  std::error_code ec;
  std::filesystem::rename(tmp, mine, ec);
  return ec;
}

PeerWatch::PeerWatch(std::string prefix, int rank, int world_size)
    : prefix_(std::move(prefix)), rank_(rank), world_size_(world_size) {
  const std::error_code ec = write_beacon("");
  STRATA_CHECK(!ec, Errc::io, "rendezvous: cannot write '", prefix_, rank_, "': ", ec.message());
  thread_ = std::thread([this] { beat(); });
}

PeerWatch::~PeerWatch() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  // "left": a rank that ends after its own error is not the cause of anyone else's, and its
  // beacon's time (now) orders it after the peer that failed first.
  (void)write_beacon("left");  // best effort: a beacon that stays unmarked ages into "silent"
}

void PeerWatch::beat() {
  const std::string mine = prefix_ + std::to_string(rank_);
  std::unique_lock<std::mutex> lock(mutex_);
  while (!cv_.wait_for(lock, kBeat, [this] { return stop_; })) {
    ::utimensat(AT_FDCWD, mine.c_str(), nullptr, 0);  // now; a failure only ages the beacon
  }
}

std::string PeerWatch::scan() const {
  const std::string host = host_name();
  const auto now = std::filesystem::file_time_type::clock::now();
  // Peers that are gone or silent, ordered by their last sign of life (the beacon's time):
  // the first is the likely cause, the others followed it.
  std::vector<std::pair<std::filesystem::file_time_type, std::string>> found;
  for (int r = 0; r < world_size_; ++r) {
    if (r == rank_) continue;
    const std::string path = prefix_ + std::to_string(r);
    long pid = 0;
    std::string peer_host, mark;
    std::ifstream(path) >> pid >> peer_host >> mark;
    std::error_code ec;
    const auto mtime = std::filesystem::last_write_time(path, ec);
    std::string what;
    if (mark == "left") {
      what = "left (it closed its communicator: its own error or its end)";
    } else if (pid > 0 && peer_host == host) {
      const char state = process_state(pid);
      if (state == 0 || state == 'Z' || state == 'X')
        what = "died";
      else if (state == 'T' || state == 't')
        what = "is stopped (SIGSTOP or a debugger)";
    }
    if (what.empty() && !ec) {
      const auto age = std::chrono::duration_cast<std::chrono::seconds>(now - mtime);
      if (age >= kBeat * kSilentBeats) what = str_cat("has been silent for ", age.count(), " s");
    }
    if (what.empty()) continue;
    found.emplace_back(ec ? now : mtime, str_cat("rank ", r, " (pid ", pid, " on ", peer_host, ") ", what));
  }
  std::stable_sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::string text;
  for (std::size_t i = 0; i < found.size(); ++i) text += (i == 0 ? "" : i == 1 ? "; then " : ", ") + found[i].second;
  return text;
}

std::string PeerWatch::diagnose(std::chrono::milliseconds settle) const {
  const auto deadline = std::chrono::steady_clock::now() + settle;
  for (;;) {
    std::string found = scan();
    if (!found.empty() || std::chrono::steady_clock::now() >= deadline) return found;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace strata::comm::detail
