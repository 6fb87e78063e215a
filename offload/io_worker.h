// IoWorker: the NVMe tier's file I/O on a thread of its own, completed in submission order
// and signalled to device streams, so that no read or write of a swap file runs inside a
// stream's host function (on CUDA, cudaLaunchHostFunc callbacks, which the driver may
// serialise with every other callback of the process).
//
// Protocol. submit(fn, finally) queues a request and returns its ticket (1, 2, 3, ...,
// modulo 2^32). The worker runs fn on its thread, then `finally` (always: after fn, after
// fn threw, or when fn was skipped), then raises the worker's HostSignal to the ticket.
// wait_on(stream, t) makes later work on a device stream wait for request t without
// blocking the caller; wait(t) blocks the caller. A request that throws makes the failure
// sticky, as on a device stream: later requests are skipped (their `finally` still runs),
// succeeded(t) is false from that ticket on, and synchronize() waits for everything queued
// and rethrows the failure. FIFO order is the ordering contract: a write queued before a
// read of the same file is on disk before the read starts. The destructor finishes what is
// queued; a failure nobody synchronized is logged.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "runtime/device/device.h"

namespace strata::offload {

class IoWorker {
 public:
  using Ticket = std::uint32_t;

  explicit IoWorker(device::Device& dev);
  ~IoWorker();
  IoWorker(const IoWorker&) = delete;
  IoWorker& operator=(const IoWorker&) = delete;

  Ticket submit(std::function<void()> fn, std::function<void()> finally = {});
  void wait_on(device::Stream& stream, Ticket t);
  void wait(Ticket t);
  // Request t (completed) ran without a failure, here or in an earlier request.
  bool succeeded(Ticket t) const;
  void synchronize();
  bool idle() const;
  Ticket last() const;  // the last ticket submitted (0: none yet)

 private:
  struct Request {
    std::function<void()> fn, finally;
  };
  void run();

  std::unique_ptr<device::HostSignal> signal_;
  mutable std::mutex mutex_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<Request> queue_;
  Ticket submitted_ = 0, completed_ = 0;
  Ticket failed_at_ = 0;  // the first request that failed (valid when error_ is set)
  std::exception_ptr error_;
  bool reported_ = false;  // synchronize() has rethrown error_
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace strata::offload
