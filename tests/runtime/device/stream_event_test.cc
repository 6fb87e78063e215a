// Host-backend stream/event stress for ThreadSanitizer: data handed between streams only
// through events must be race-free (the event's mark gives the happens-before edge).
#include <atomic>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "runtime/device/device.h"

using namespace strata::device;

TEST_CASE("a ring of streams passing plain data through events has no race and loses no update", "[device][stress]") {
  DeviceOptions o;
  auto dev = Device::create(o);
  constexpr int kStreams = 4, kRounds = 300;
  std::vector<std::unique_ptr<Stream>> streams;
  std::vector<std::unique_ptr<Event>> events;
  for (int i = 0; i < kStreams; ++i) {
    streams.push_back(dev->create_stream());
    events.push_back(dev->create_event());
  }
  long counter = 0;  // deliberately not atomic: only event ordering protects it
  std::vector<int> order;
  for (int r = 0; r < kRounds; ++r) {
    for (int i = 0; i < kStreams; ++i) {
      const int prev = (i + kStreams - 1) % kStreams;
      if (r > 0 || i > 0) streams[i]->wait(*events[prev]);
      streams[i]->launch_host([&counter, &order, i] {
        ++counter;
        order.push_back(i);
      });
      streams[i]->record(*events[i]);
    }
  }
  dev->synchronize();
  CHECK(counter == kStreams * kRounds);
  REQUIRE(order.size() == static_cast<std::size_t>(kStreams * kRounds));
  for (std::size_t k = 0; k < order.size(); ++k) CHECK(order[k] == static_cast<int>(k % kStreams));
}

TEST_CASE("many threads submitting to one stream keep each thread's order", "[device][stress]") {
  DeviceOptions o;
  auto dev = Device::create(o);
  auto s = dev->create_stream();
  constexpr int kThreads = 4, kTasks = 500;
  std::vector<std::vector<int>> seen(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < kTasks; ++k) s->launch_host([&seen, t, k] { seen[t].push_back(k); });
    });
  }
  for (auto& th : threads) th.join();
  s->synchronize();
  for (int t = 0; t < kThreads; ++t) {
    REQUIRE(seen[t].size() == static_cast<std::size_t>(kTasks));
    for (int k = 0; k < kTasks; ++k) CHECK(seen[t][k] == k);
  }
}

TEST_CASE("destroying a stream waits for its queued work", "[device]") {
  DeviceOptions o;
  auto dev = Device::create(o);
  std::atomic<int> done{0};
  {
    auto s = dev->create_stream();
    for (int i = 0; i < 50; ++i) s->launch_host([&] { ++done; });
  }
  CHECK(done == 50);
}
