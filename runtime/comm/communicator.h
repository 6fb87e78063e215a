// Collectives between ranks (docs/design.md, "runtime/comm"). Backends: Gloo (CPU ranks over TCP,
// processes or threads) and NCCL (GPU ranks). Strata writes no collective algorithm of its
// own: every reduction is the backend's.
//
// Protocol. Every rank creates one Communicator from the same rendezvous and issues the same
// collectives in the same order (as with MPI and NCCL). Operations run in issue order on
// the communicator's worker; blocking calls return when their own op is done, *_async calls
// return a Work to wait on, and the stream forms enqueue the op on a device Stream. Buffers
// belong to the caller and must stay valid until the op completes. Every op has the
// communicator's timeout: a dead or absent peer becomes Errc::comm/Errc::timeout naming
// this rank, the op and its size, and the peer that died, stopped or went silent (from the
// ranks' beacons in the rendezvous directory), never a hang. After a failure the
// communicator is broken and every later op fails at once; destroying it never waits for a
// peer.
//
// Sizes that do not divide by the world size: the *_v forms take per-rank counts; the
// caller may instead pad to a multiple of world_size (ZeRO's partitioner pads).
// Reductions of bf16/fp16 accumulate in fp32 (inputs converted, summed, rounded once).
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/core/dtype.h"

namespace strata::device {
class Stream;
}

namespace strata::comm {

enum class ReduceOp { sum, max, avg };
const char* reduce_op_name(ReduceOp op) noexcept;

enum class Backend { gloo, nccl };

// Where and how ranks meet. `path` is a directory on a filesystem all ranks share (the
// file store); `run_id` separates runs that reuse it.
struct RendezvousConfig {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string path;
  std::string run_id = "default";
  std::chrono::milliseconds timeout{60000};
};

// Reads STRATA_RANK, STRATA_WORLD_SIZE, STRATA_LOCAL_RANK, STRATA_RENDEZVOUS=file:///dir,
// STRATA_RUN_ID, STRATA_COMM_TIMEOUT_MS; falls back to the variables torchrun (RANK,
// WORLD_SIZE, LOCAL_RANK), Open MPI (OMPI_COMM_WORLD_*), MPICH/PMI (PMI_RANK, PMI_SIZE)
// and Slurm (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_JOB_ID) set. Throws naming
// the missing or malformed variable.
RendezvousConfig rendezvous_from_env();

struct CommOptions {
  Backend backend = Backend::gloo;
  RendezvousConfig rendezvous;
  std::string interface;   // Gloo: network interface (e.g. "eth0"); empty: $STRATA_COMM_IFACE or
                           // $GLOO_SOCKET_IFNAME, else loopback (ranks on one host)
  int device_ordinal = 0;  // NCCL: CUDA device of this rank
};

class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;  // rethrows the op's error
  virtual bool test() = 0;  // done (successfully or not)
};

class Communicator {
 public:
  static std::unique_ptr<Communicator> create(const CommOptions& options);
  virtual ~Communicator() = default;

  virtual int rank() const noexcept = 0;
  virtual int world_size() const noexcept = 0;
  virtual Backend backend() const noexcept = 0;

  // recv holds world_size * count elements, rank r's at [r * count, (r+1) * count).
  virtual std::shared_ptr<Work> all_gather_async(const void* send, void* recv, std::size_t count, DType t) = 0;
  // recv holds sum(counts); rank r contributes counts[r] elements (send).
  virtual std::shared_ptr<Work> all_gather_v_async(const void* send, void* recv, std::vector<std::size_t> counts,
                                                   DType t) = 0;
  // send holds world_size * count elements; recv gets this rank's reduced slice.
  virtual std::shared_ptr<Work> reduce_scatter_async(const void* send, void* recv, std::size_t count, DType t,
                                                     ReduceOp op) = 0;
  virtual std::shared_ptr<Work> reduce_scatter_v_async(const void* send, void* recv, std::vector<std::size_t> counts,
                                                       DType t, ReduceOp op) = 0;
  virtual std::shared_ptr<Work> all_reduce_async(void* buffer, std::size_t count, DType t, ReduceOp op) = 0;
  virtual std::shared_ptr<Work> broadcast_async(void* buffer, std::size_t count, DType t, int root) = 0;
  virtual std::shared_ptr<Work> send_async(const void* buffer, std::size_t bytes, int peer, int tag = 0) = 0;
  virtual std::shared_ptr<Work> recv_async(void* buffer, std::size_t bytes, int peer, int tag = 0) = 0;
  virtual std::shared_ptr<Work> barrier_async() = 0;

  // Blocking forms.
  void all_gather(const void* send, void* recv, std::size_t count, DType t) {
    all_gather_async(send, recv, count, t)->wait();
  }
  void all_gather_v(const void* send, void* recv, std::vector<std::size_t> counts, DType t) {
    all_gather_v_async(send, recv, std::move(counts), t)->wait();
  }
  void reduce_scatter(const void* send, void* recv, std::size_t count, DType t, ReduceOp op = ReduceOp::sum) {
    reduce_scatter_async(send, recv, count, t, op)->wait();
  }
  void reduce_scatter_v(const void* send, void* recv, std::vector<std::size_t> counts, DType t,
                        ReduceOp op = ReduceOp::sum) {
    reduce_scatter_v_async(send, recv, std::move(counts), t, op)->wait();
  }
  void all_reduce(void* buffer, std::size_t count, DType t, ReduceOp op = ReduceOp::sum) {
    all_reduce_async(buffer, count, t, op)->wait();
  }
  void broadcast(void* buffer, std::size_t count, DType t, int root) {
    broadcast_async(buffer, count, t, root)->wait();
  }
  void send(const void* buffer, std::size_t bytes, int peer, int tag = 0) {
    send_async(buffer, bytes, peer, tag)->wait();
  }
  void recv(void* buffer, std::size_t bytes, int peer, int tag = 0) { recv_async(buffer, bytes, peer, tag)->wait(); }
  void barrier() { barrier_async()->wait(); }

  // Stream-ordered forms for device buffers: the op starts when `stream` reaches it and
  // later work on `stream` sees its result. Host backend: a stream task that runs the op;
  // NCCL: the collective is launched on the CUDA stream itself.
  virtual void all_gather(const void* send, void* recv, std::size_t count, DType t, device::Stream& stream);
  virtual void reduce_scatter(const void* send, void* recv, std::size_t count, DType t, ReduceOp op,
                              device::Stream& stream);
  virtual void all_reduce(void* buffer, std::size_t count, DType t, ReduceOp op, device::Stream& stream);
  virtual void broadcast(void* buffer, std::size_t count, DType t, int root, device::Stream& stream);
};

// The mean over every rank of one value (a logged loss), averaged in fp32; the value itself
// without a communicator or alone. A collective: every rank calls it.
double mean_over_ranks(Communicator* comm, double value);

}  // namespace strata::comm
