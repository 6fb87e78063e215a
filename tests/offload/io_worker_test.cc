// The NVMe tier's I/O worker (offload/io_worker.h) on the host device: requests run in
// submission order on the worker's thread, device streams wait on their tickets without a
// host function, and a failure is sticky with every `finally` still run.
#include <atomic>
#include <chrono>
#include <future>
#include <stdexcept>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "offload/io_worker.h"
#include "runtime/device/device.h"
#include "tests/support/host_device.h"

using namespace strata;
using namespace std::chrono_literals;

TEST_CASE("io worker: requests run in order on one thread other than the caller's", "[offload][io_worker]") {
  auto dev = test::small_host_device();
  offload::IoWorker io(*dev);
  std::vector<int> order;
  std::vector<std::thread::id> threads;
  std::vector<offload::IoWorker::Ticket> tickets;
  for (int i = 0; i < 50; ++i) {
    tickets.push_back(io.submit([&, i] {
      order.push_back(i);
      threads.push_back(std::this_thread::get_id());
    }));
  }
  io.synchronize();
  CHECK(io.idle());
  for (int i = 0; i < 50; ++i) {
    CHECK(order[i] == i);
    CHECK(tickets[i] == static_cast<offload::IoWorker::Ticket>(i + 1));
    CHECK(io.succeeded(tickets[i]));
    CHECK(threads[i] == threads[0]);
  }
  CHECK(threads[0] != std::this_thread::get_id());
}

TEST_CASE("io worker: a stream waits for a request's ticket, the caller does not", "[offload][io_worker]") {
  auto dev = test::small_host_device();
  offload::IoWorker io(*dev);
  auto stream = dev->create_stream();
  std::promise<void> gate;
  auto opened = gate.get_future().share();
  std::atomic<int> data{0};
  const auto first = io.submit([opened] { opened.wait(); });
  const auto second = io.submit([&] { data = 42; });
  std::atomic<int> seen{-1};
  io.wait_on(*stream, second);
  stream->launch_host([&] { seen = data.load(); });
  auto done = dev->create_event();
  stream->record(*done);
  std::this_thread::sleep_for(50ms);
  CHECK_FALSE(done->query());  // the request it waits for is held up behind the first
  CHECK_FALSE(io.idle());
  gate.set_value();
  io.wait(first);
  done->synchronize();
  CHECK(seen == 42);  // the stream's work ran after the request, and saw what it wrote
  io.synchronize();
}

TEST_CASE("io worker: a failure is sticky, later requests are skipped, every finally runs", "[offload][io_worker]") {
  auto dev = test::small_host_device();
  auto stream = dev->create_stream();
  int finals = 0;
  std::vector<int> ran;
  {
    offload::IoWorker io(*dev);
    const auto ok = io.submit([&] { ran.push_back(1); }, [&] { ++finals; });
    const auto bad = io.submit([&] { throw std::runtime_error("disk full in 'params/layer 3.a'"); }, [&] { ++finals; });
    const auto after = io.submit([&] { ran.push_back(3); }, [&] { ++finals; });
    io.wait_on(*stream, after);  // released although its request was skipped
    auto done = dev->create_event();
    stream->record(*done);
    done->synchronize();
    CHECK(io.succeeded(ok));
    CHECK_FALSE(io.succeeded(bad));
    CHECK_FALSE(io.succeeded(after));
    CHECK_THROWS_WITH(io.synchronize(), Catch::Contains("disk full in 'params/layer 3.a'"));
    CHECK_THROWS_WITH(io.synchronize(), Catch::Contains("disk full"));  // every time
    io.submit([&] { ran.push_back(4); }, [&] { ++finals; });
  }  // the destructor finishes what is queued
  CHECK(ran == std::vector<int>{1});
  CHECK(finals == 4);
}

TEST_CASE("io worker: the destructor runs what is still queued", "[offload][io_worker]") {
  auto dev = test::small_host_device();
  std::atomic<int> count{0};
  {
    offload::IoWorker io(*dev);
    for (int i = 0; i < 20; ++i) {
      io.submit([&] {
        std::this_thread::sleep_for(1ms);
        ++count;
      });
    }
  }
  CHECK(count == 20);
}
