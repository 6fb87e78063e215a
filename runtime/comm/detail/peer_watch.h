// Who went away: every rank of a multi-rank run keeps a beacon file in the rendezvous
// directory (its pid and host, its mtime refreshed every second by a small thread). When a
// collective fails or times out, diagnose() reads the other ranks' beacons and names the
// ones that died (gone or a zombie, on this host), are stopped (SIGSTOP, on this host), left
// (a rank rewrites its beacon as it closes its communicator) or have been silent for several
// beats (any host: the directory is shared), first the one whose last sign of life is
// oldest: an error says which peer failed first, not only which op noticed. Private to comm.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>

namespace strata::comm::detail {

class PeerWatch {
 public:
  // `prefix` + rank is each rank's beacon path; this rank's is written (by rename) now.
  PeerWatch(std::string prefix, int rank, int world_size);
  ~PeerWatch();  // stops the beat and marks the beacon "left" (peers may still read it)
  PeerWatch(const PeerWatch&) = delete;
  PeerWatch& operator=(const PeerWatch&) = delete;

  // "rank 1 (pid 4242 on h) died; then rank 0 (pid 4240 on h) left (...)", or "" when every
  // peer looks alive and beating. Waits up to `settle` for a peer that is going away to
  // show it (a killed process's sockets close before its pid is reaped).
  std::string diagnose(std::chrono::milliseconds settle = std::chrono::milliseconds(1500)) const;

  static constexpr std::chrono::seconds kBeat{1};
  static constexpr int kSilentBeats = 3;  // a beacon older than this many beats is silent

 private:
  std::error_code write_beacon(const char* mark) const;
  std::string scan() const;
  void beat();

  std::string prefix_;
  int rank_;
  int world_size_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace strata::comm::detail
