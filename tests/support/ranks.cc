// Thread ranks (see ranks.h).
#include "tests/support/ranks.h"

#include <algorithm>
#include <atomic>
#include <thread>

#include "tests/support/temp_dir.h"

namespace strata::test {

std::vector<RankOutcome> run_thread_ranks(int world, std::function<void(comm::Communicator&)> body,
                                          std::chrono::milliseconds timeout, std::vector<int> absent) {
  return run_thread_ranks_with(
      world, [&](comm::Communicator& c, const comm::CommOptions&) { body(c); }, timeout, std::move(absent));
}

std::vector<RankOutcome> run_thread_ranks_with(int world,
                                               std::function<void(comm::Communicator&, const comm::CommOptions&)> body,
                                               std::chrono::milliseconds timeout, std::vector<int> absent) {
  static std::atomic<int> run_counter{0};
  TempDir dir("strata-rdzv");
  const std::string run_id = "t" + std::to_string(run_counter++);
  std::vector<RankOutcome> out(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    if (std::find(absent.begin(), absent.end(), r) != absent.end()) continue;
    threads.emplace_back([&, r] {
      const auto t0 = std::chrono::steady_clock::now();
      try {
        comm::CommOptions o;
        o.rendezvous.rank = r;
        o.rendezvous.world_size = world;
        o.rendezvous.path = dir.path();
        o.rendezvous.run_id = run_id;
        o.rendezvous.timeout = timeout;
        auto c = comm::Communicator::create(o);
        body(*c, o);
      } catch (...) {
        out[r].error = std::current_exception();
      }
      out[r].seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

void rethrow_first(const std::vector<RankOutcome>& outcomes) {
  for (const auto& o : outcomes) {
    if (o.error) std::rethrow_exception(o.error);
  }
}

}  // namespace strata::test
