// The local launcher: environment, output prefixes, failure naming, Ctrl-C forwarding.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include <catch2/catch.hpp>

#include "runtime/comm/launch.h"

using namespace strata;
using namespace std::chrono_literals;

TEST_CASE("launch gives every rank its environment and prefixes its lines", "[launch]") {
  comm::LaunchOptions o;
  o.nprocs = 3;
  o.command = {"sh", "-c",
               "echo r=$STRATA_RANK n=$STRATA_WORLD_SIZE l=$STRATA_LOCAL_RANK; echo $STRATA_RENDEZVOUS $STRATA_RUN_ID"};
  o.capture = true;
  o.only_rank_output = 999;
  const auto r = comm::launch_local(o);
  REQUIRE(r.exit_code == 0);
  CHECK(r.failed_rank == -1);
  for (int k = 0; k < 3; ++k) {
    CHECK_THAT(r.ranks[k].output, Catch::Contains("r=" + std::to_string(k) + " n=3 l=" + std::to_string(k)));
    CHECK_THAT(r.ranks[k].output, Catch::Contains("file:///") && Catch::Contains("launch-"));
  }
}

TEST_CASE("a failing rank stops the others and is named", "[launch][negative]") {
  comm::LaunchOptions o;
  o.nprocs = 3;
  o.command = {"sh", "-c", "if [ $STRATA_RANK = 2 ]; then exit 7; fi; sleep 30"};
  o.grace = 200ms;
  o.only_rank_output = 999;
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = comm::launch_local(o);
  CHECK(std::chrono::steady_clock::now() - t0 < 10s);
  CHECK(r.exit_code == 7);
  CHECK(r.failed_rank == 2);
  CHECK_THAT(r.summary, Catch::Contains("rank 2") && Catch::Contains("exited with code 7"));
  CHECK(r.ranks[0].terminated_by_launcher);
  CHECK(r.ranks[0].signal == SIGTERM);
}

TEST_CASE("a command that does not exist is reported, not hung on", "[launch][negative]") {
  comm::LaunchOptions o;
  o.nprocs = 2;
  o.command = {"/nonexistent/strata-binary"};
  o.capture = true;
  o.grace = 100ms;
  o.only_rank_output = 999;
  const auto r = comm::launch_local(o);
  CHECK(r.exit_code == 127);
  CHECK_THAT(r.ranks[r.failed_rank].output, Catch::Contains("cannot run '/nonexistent/strata-binary'"));
}

TEST_CASE("Ctrl-C is forwarded to every rank", "[launch]") {
  comm::LaunchOptions o;
  o.nprocs = 2;
  o.command = {"sleep", "30"};
  o.only_rank_output = 999;
  std::thread ctrl_c([] {
    std::this_thread::sleep_for(300ms);
    kill(getpid(), SIGINT);
  });
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = comm::launch_local(o);
  ctrl_c.join();
  CHECK(std::chrono::steady_clock::now() - t0 < 10s);
  CHECK(r.exit_code == 128 + SIGINT);
  for (const auto& e : r.ranks) CHECK(e.signal == SIGINT);
}
