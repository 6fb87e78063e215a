// Local mailboxes and the Communicator-backed transport (see transport.h).
#include "pipeline/transport.h"

#include <cstring>
#include <exception>

#include "runtime/comm/communicator.h"
#include "runtime/core/error.h"
#include "runtime/core/log.h"

namespace strata::pipeline {

void LocalMailboxes::put(int from, int to, std::uint32_t tag, const void* data, std::size_t bytes) {
  std::vector<unsigned char> copy(bytes);
  if (bytes > 0) std::memcpy(copy.data(), data, bytes);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const bool fresh = boxes_.emplace(std::make_tuple(from, to, tag), std::move(copy)).second;
    STRATA_CHECK(fresh, Errc::internal, "stage ", from, " sent message ", tag, " to stage ", to,
                 " twice; the schedule should have been rejected");
  }
  cv_.notify_all();
}

void LocalMailboxes::take(int from, int to, std::uint32_t tag, void* data, std::size_t bytes) {
  std::unique_lock<std::mutex> lock(mutex_);
  const auto key = std::make_tuple(from, to, tag);
  const bool arrived = cv_.wait_for(lock, timeout_, [&] { return !aborted_.empty() || boxes_.count(key) > 0; });
  STRATA_CHECK(aborted_.empty(), Errc::comm, "stage ", to, " stopped waiting for stage ", from, ": ", aborted_);
  STRATA_CHECK(arrived, Errc::timeout, "stage ", to, ": no message ", tag, " from stage ", from, " within ",
               timeout_.count(), " ms");
  auto it = boxes_.find(key);
  STRATA_CHECK(it->second.size() == bytes, Errc::internal, "stage ", to, ": message ", tag, " from stage ", from,
               " has ", it->second.size(), " bytes, expected ", bytes);
  if (bytes > 0) std::memcpy(data, it->second.data(), bytes);
  boxes_.erase(it);
}

void LocalMailboxes::abort(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (aborted_.empty()) aborted_ = why.empty() ? "aborted" : why;
  }
  cv_.notify_all();
}

void LocalTransport::send(int peer, std::uint32_t tag, const void* data, std::size_t bytes) {
  boxes_.put(stage_, peer, tag, data, bytes);
}

void LocalTransport::recv(int peer, std::uint32_t tag, void* data, std::size_t bytes) {
  boxes_.take(peer, stage_, tag, data, bytes);
}

CommTransport::~CommTransport() {
  try {
    flush();
  } catch (const std::exception& e) {
    STRATA_LOG(warn, "pipeline: unsent messages at shutdown: ", e.what());
  }
}

void CommTransport::send(int peer, std::uint32_t tag, const void* data, std::size_t bytes) {
  STRATA_CHECK(tag <= 0x7fffffffu, Errc::invalid_argument, "pipeline: message tag ", tag, " does not fit Gloo's tags");
  auto p = std::make_unique<Pending>();
  p->bytes.resize(bytes);
  if (bytes > 0) std::memcpy(p->bytes.data(), data, bytes);
  p->work = comm_.send_async(p->bytes.data(), bytes, peer, static_cast<int>(tag));
  pending_.push_back(std::move(p));
}

void CommTransport::expect(int peer, std::uint32_t tag, std::size_t bytes) {
  STRATA_CHECK(tag <= 0x7fffffffu, Errc::invalid_argument, "pipeline: message tag ", tag, " does not fit Gloo's tags");
  auto p = std::make_unique<Pending>();
  p->bytes.resize(bytes);
  p->work = comm_.recv_async(p->bytes.data(), bytes, peer, static_cast<int>(tag));
  const bool fresh = posted_.emplace(std::make_pair(peer, tag), std::move(p)).second;
  STRATA_CHECK(fresh, Errc::internal, "pipeline: receive ", tag, " from rank ", peer, " posted twice");
}

void CommTransport::recv(int peer, std::uint32_t tag, void* data, std::size_t bytes) {
  STRATA_CHECK(tag <= 0x7fffffffu, Errc::invalid_argument, "pipeline: message tag ", tag, " does not fit Gloo's tags");
  const auto it = posted_.find({peer, tag});
  if (it == posted_.end()) {
    comm_.recv_async(data, bytes, peer, static_cast<int>(tag))->wait();
    return;
  }
  const auto p = std::move(it->second);
  posted_.erase(it);
  p->work->wait();
  STRATA_CHECK(p->bytes.size() == bytes, Errc::internal, "pipeline: receive ", tag, " from rank ", peer, " expected ",
               p->bytes.size(), " bytes, asked for ", bytes);
  if (bytes > 0) std::memcpy(data, p->bytes.data(), bytes);
}

void CommTransport::flush() {
  // Every send's buffer lives until its transfer is done.
  // On a failure, still wait for the others before their buffers go. Early receives
  // nobody asked for (a failed step) are waited for too, for the same reason.
  auto pending = std::move(pending_);
  pending_.clear();
  for (auto& [key, p] : posted_) pending.push_back(std::move(p));
  posted_.clear();
  std::exception_ptr first;
  for (auto& p : pending) {
    try {
      p->work->wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace strata::pipeline
