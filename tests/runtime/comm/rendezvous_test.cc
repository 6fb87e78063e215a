// Rendezvous: the environment of Strata, torchrun, MPI and Slurm, and ranks that never come.
#include <cstdlib>

#include <catch2/catch.hpp>

#include "runtime/core/error.h"
#include "tests/support/ranks.h"

using namespace strata;
using namespace std::chrono_literals;

namespace {
struct EnvGuard {
  std::vector<std::string> names;
  explicit EnvGuard(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const char* n : {"STRATA_RANK", "STRATA_WORLD_SIZE", "STRATA_LOCAL_RANK", "STRATA_RENDEZVOUS", "STRATA_RUN_ID",
                          "STRATA_COMM_TIMEOUT_MS", "RANK", "WORLD_SIZE", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK",
                          "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
                          "SLURM_LOCALID", "SLURM_JOB_ID", "SLURM_STEP_ID", "TORCHELASTIC_RUN_ID"}) {
      unsetenv(n);
      names.emplace_back(n);
    }
    for (auto [k, v] : vars) setenv(k, v, 1);
  }
  ~EnvGuard() {
    for (auto& n : names) unsetenv(n.c_str());
  }
};
}  // namespace

TEST_CASE("rendezvous settings come from Strata's, torchrun's, MPI's or Slurm's variables", "[comm][rendezvous]") {
  {
    EnvGuard g({{"STRATA_RANK", "2"},
                {"STRATA_WORLD_SIZE", "4"},
                {"STRATA_RENDEZVOUS", "file:///tmp/r"},
                {"STRATA_RUN_ID", "x7"},
                {"STRATA_COMM_TIMEOUT_MS", "1234"}});
    const auto c = comm::rendezvous_from_env();
    CHECK(c.rank == 2);
    CHECK(c.world_size == 4);
    CHECK(c.path == "/tmp/r");
    CHECK(c.run_id == "x7");
    CHECK(c.timeout == 1234ms);
  }
  {
    EnvGuard g({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"STRATA_RENDEZVOUS", "file:///s"}});
    const auto c = comm::rendezvous_from_env();
    CHECK((c.rank == 1 && c.world_size == 2));
  }
  {
    EnvGuard g({{"SLURM_PROCID", "3"},
                {"SLURM_NTASKS", "8"},
                {"SLURM_LOCALID", "1"},
                {"SLURM_JOB_ID", "991"},
                {"SLURM_STEP_ID", "0"},
                {"STRATA_RENDEZVOUS", "file:///s"}});
    const auto c = comm::rendezvous_from_env();
    CHECK((c.rank == 3 && c.world_size == 8 && c.local_rank == 1 && c.run_id == "991.0"));
  }
  {
    EnvGuard g({});
    const auto c = comm::rendezvous_from_env();
    CHECK((c.rank == 0 && c.world_size == 1));
  }
}

TEST_CASE("missing or malformed rendezvous variables are named", "[comm][rendezvous][negative]") {
  {
    EnvGuard g({{"STRATA_RANK", "0"}, {"STRATA_WORLD_SIZE", "2"}});
    CHECK_THROWS_WITH(comm::rendezvous_from_env(), Catch::Contains("STRATA_RENDEZVOUS is not set"));
  }
  {
    EnvGuard g({{"STRATA_RANK", "x"}, {"STRATA_WORLD_SIZE", "2"}});
    CHECK_THROWS_WITH(comm::rendezvous_from_env(), Catch::Contains("STRATA_RANK='x'"));
  }
  {
    EnvGuard g({{"STRATA_RANK", "2"}, {"STRATA_WORLD_SIZE", "2"}, {"STRATA_RENDEZVOUS", "file:///s"}});
    CHECK_THROWS_WITH(comm::rendezvous_from_env(), Catch::Contains("not below"));
  }
  {
    EnvGuard g({{"STRATA_WORLD_SIZE", "2"}});
    CHECK_THROWS_WITH(comm::rendezvous_from_env(), Catch::Contains("STRATA_RANK"));
  }
  {
    EnvGuard g({{"STRATA_RANK", "0"}, {"STRATA_WORLD_SIZE", "2"}, {"STRATA_RENDEZVOUS", "tcp://h:1"}});
    CHECK_THROWS_WITH(comm::rendezvous_from_env(), Catch::Contains("file:///path"));
  }
}

TEST_CASE("a rank that never arrives is named by the others within the timeout", "[comm][rendezvous][negative]") {
  const auto outcomes = test::run_thread_ranks(3, [](comm::Communicator&) {}, 800ms, /*absent=*/{2});
  for (int r : {0, 1}) {
    REQUIRE(outcomes[r].error);
    try {
      std::rethrow_exception(outcomes[r].error);
    } catch (const Error& e) {
      CHECK(e.code() == Errc::timeout);
      CHECK_THAT(e.what(), Catch::Contains("rank(s) 2 did not arrive within 800 ms"));
    }
    CHECK(outcomes[r].seconds < 3.0);
  }
}
