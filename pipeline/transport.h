// How stages exchange activations and gradients. LocalMailboxes connects stages that are
// threads of one process; CommTransport connects stages that are ranks (rank = stage) of a
// comm::Communicator, through Gloo's point-to-point send/recv.
//
// Protocol. send() copies the bytes and returns at once (the executor never blocks on a
// send, as the validator assumes); recv() blocks until the message with that (peer, tag)
// arrives, the timeout passes (Errc::timeout) or the run is aborted (Errc::comm). flush()
// waits until every send has been delivered. expect() announces a receive to come, so a
// transport whose sends wait for the receiver (Gloo's rendezvous: data moves only once the
// receive is posted) can post it early and let the data land while the stage computes.
// A Transport belongs to one stage's thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

namespace strata::comm {
class Communicator;
class Work;
}  // namespace strata::comm

namespace strata::pipeline {

class Transport {
 public:
  virtual ~Transport() = default;
  virtual void send(int peer, std::uint32_t tag, const void* data, std::size_t bytes) = 0;
  virtual void recv(int peer, std::uint32_t tag, void* data, std::size_t bytes) = 0;
  virtual void expect(int peer, std::uint32_t tag, std::size_t bytes) { (void)peer, (void)tag, (void)bytes; }
  virtual void flush() = 0;
};

// The mailboxes of one threaded run, shared by its stages' LocalTransports.
class LocalMailboxes {
 public:
  explicit LocalMailboxes(std::chrono::milliseconds timeout = std::chrono::milliseconds(60000)) : timeout_(timeout) {}
  void put(int from, int to, std::uint32_t tag, const void* data, std::size_t bytes);
  void take(int from, int to, std::uint32_t tag, void* data, std::size_t bytes);
  // Wakes every waiting take() with Errc::comm naming `why` (a stage failed).
  void abort(const std::string& why);

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::map<std::tuple<int, int, std::uint32_t>, std::vector<unsigned char>> boxes_;
  std::string aborted_;
  std::chrono::milliseconds timeout_;
};

class LocalTransport final : public Transport {
 public:
  LocalTransport(LocalMailboxes& boxes, int stage) : boxes_(boxes), stage_(stage) {}
  void send(int peer, std::uint32_t tag, const void* data, std::size_t bytes) override;
  void recv(int peer, std::uint32_t tag, void* data, std::size_t bytes) override;
  void flush() override {}

 private:
  LocalMailboxes& boxes_;
  int stage_;
};

class CommTransport final : public Transport {
 public:
  explicit CommTransport(comm::Communicator& comm) : comm_(comm) {}
  ~CommTransport() override;
  void send(int peer, std::uint32_t tag, const void* data, std::size_t bytes) override;
  void recv(int peer, std::uint32_t tag, void* data, std::size_t bytes) override;
  // Posts the receive into a buffer of its own; recv() of the same (peer, tag) copies out.
  void expect(int peer, std::uint32_t tag, std::size_t bytes) override;
  void flush() override;

 private:
  struct Pending {
    std::shared_ptr<comm::Work> work;
    std::vector<unsigned char> bytes;
  };
  comm::Communicator& comm_;
  std::vector<std::unique_ptr<Pending>> pending_;                             // sends
  std::map<std::pair<int, std::uint32_t>, std::unique_ptr<Pending>> posted_;  // early receives
};

}  // namespace strata::pipeline
