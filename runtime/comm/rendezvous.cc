// Rendezvous configuration from the environment: Strata's own variables first, then those
// of torchrun, Open MPI, MPICH/PMI and Slurm, so cluster launchers work unchanged.
#include <cstdlib>
#include <string>

#include "runtime/comm/communicator.h"
#include "runtime/core/error.h"

namespace strata::comm {
namespace {

const char* first_env(std::initializer_list<const char*> names, const char** which) {
  for (const char* n : names) {
    const char* v = std::getenv(n);
    if (v != nullptr && *v != '\0') {
      *which = n;
      return v;
    }
  }
  *which = nullptr;
  return nullptr;
}

int parse_int(const char* name, const char* text) {
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  STRATA_CHECK(end != text && *end == '\0' && v >= 0 && v < (1 << 24), Errc::invalid_argument, "environment variable ",
               name, "='", text, "' is not a non-negative integer");
  return static_cast<int>(v);
}

}  // namespace

const char* reduce_op_name(ReduceOp op) noexcept {
  return op == ReduceOp::sum ? "sum" : op == ReduceOp::max ? "max" : "avg";
}

RendezvousConfig rendezvous_from_env() {
  RendezvousConfig c;
  const char* which = nullptr;
  const char* rank = first_env({"STRATA_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"}, &which);
  const char* rank_var = which;
  const char* size =
      first_env({"STRATA_WORLD_SIZE", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"}, &which);
  const char* size_var = which;
  if (rank == nullptr && size == nullptr) {
    c.path.clear();  // single process: no rendezvous needed
    return c;
  }
  STRATA_CHECK(rank != nullptr && size != nullptr, Errc::invalid_argument,
               rank == nullptr ? "STRATA_WORLD_SIZE (or an equivalent) is set but STRATA_RANK is not"
                               : "STRATA_RANK (or an equivalent) is set but STRATA_WORLD_SIZE is not",
               ": set both, or start the ranks with `strata launch -n N -- ...`");
  c.rank = parse_int(rank_var, rank);
  c.world_size = parse_int(size_var, size);
  STRATA_CHECK(c.world_size >= 1 && c.rank < c.world_size, Errc::invalid_argument, rank_var, "=", c.rank,
               " is not below ", size_var, "=", c.world_size);
  if (const char* lr = first_env(
          {"STRATA_LOCAL_RANK", "LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"},
          &which)) {
    c.local_rank = parse_int(which, lr);
  }
  if (const char* t = std::getenv("STRATA_COMM_TIMEOUT_MS")) {
    c.timeout = std::chrono::milliseconds(parse_int("STRATA_COMM_TIMEOUT_MS", t));
  }
  if (const char* id = first_env({"STRATA_RUN_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"}, &which)) {
    c.run_id = id;
    if (std::string(which) == "SLURM_JOB_ID") {
      if (const char* step = std::getenv("SLURM_STEP_ID")) c.run_id += std::string(".") + step;
    }
  }
  const char* url = std::getenv("STRATA_RENDEZVOUS");
  if (c.world_size > 1) {
    STRATA_CHECK(url != nullptr && *url != '\0', Errc::invalid_argument, "STRATA_RENDEZVOUS is not set for rank ",
                 c.rank, " of ", c.world_size,
                 ": set it to file:///shared/dir (a directory every rank can reach), or use `strata launch`");
    std::string u = url;
    const std::string scheme = "file://";
    STRATA_CHECK(u.rfind(scheme, 0) == 0 && u.size() > scheme.size(), Errc::invalid_argument, "STRATA_RENDEZVOUS='", u,
                 "' is not a file:///path URL (the only store Strata has)");
    c.path = u.substr(scheme.size());
  }
  return c;
}

}  // namespace strata::comm
