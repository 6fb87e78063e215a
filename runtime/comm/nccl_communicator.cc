// The NCCL backend for GPU ranks. The unique id travels through the same file store as
// Gloo's addresses. Collectives run on an internal CUDA stream (async forms, waited on
// with the communicator's timeout; on timeout the communicator is aborted so no rank hangs)
// or on the caller's CUDA stream (stream-ordered forms). bf16/fp16 sums are widened to fp32
// on the device first, as the Gloo backend does. Built whenever NCCL is found; exercised
// only where a GPU is present.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "runtime/comm/detail/gloo_backend.h"
#include "runtime/comm/detail/store.h"
#include "runtime/comm/detail/work.h"
#include "runtime/core/error.h"
#include "runtime/device/cuda_check.h"
#include "runtime/device/device.h"
#include "runtime/device/ops.h"

#define STRATA_NCCL_CHECK(expr, ...)                                                                               \
  do {                                                                                                             \
    const ncclResult_t strata_nccl_rc_ = (expr);                                                                   \
    if (strata_nccl_rc_ != ncclSuccess && strata_nccl_rc_ != ncclInProgress) {                                     \
      ::strata::detail::throw_error(                                                                               \
          ::strata::Errc::comm,                                                                                    \
          ::strata::str_cat(__VA_ARGS__, ": ", #expr, " failed: ", ncclGetErrorString(strata_nccl_rc_)), __FILE__, \
          __LINE__);                                                                                               \
    }                                                                                                              \
  } while (0)

namespace strata::comm::detail {
namespace {

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::sum ? ncclSum : op == ReduceOp::max ? ncclMax : ncclAvg; }

// Completion of work on the internal stream, polled with a deadline; on timeout or an
// asynchronous NCCL error the communicator is aborted and the error names the op.
class NcclWork final : public Work {
 public:
  NcclWork(cudaEvent_t event, ncclComm_t comm, std::string what, std::chrono::milliseconds timeout)
      : event_(event), comm_(comm), what_(std::move(what)), timeout_(timeout) {}
  ~NcclWork() override { cudaEventDestroy(event_); }
  bool test() override { return cudaEventQuery(event_) == cudaSuccess; }
  void wait() override {
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    for (;;) {
      const cudaError_t e = cudaEventQuery(event_);
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) STRATA_CUDA_CHECK(e, what_);
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        ncclCommAbort(comm_);
        STRATA_THROW(Errc::comm, what_, " failed: ", ncclGetErrorString(async), "; the communicator was aborted");
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        ncclCommAbort(comm_);
        STRATA_THROW(Errc::timeout, what_, ": no completion within ", timeout_.count(),
                     " ms; a peer rank died or issued a different collective. The communicator was aborted");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

 private:
  cudaEvent_t event_;
  ncclComm_t comm_;
  std::string what_;
  std::chrono::milliseconds timeout_;
};

class NcclCommunicator final : public Communicator {
 public:
  explicit NcclCommunicator(const CommOptions& o) : cfg_(o.rendezvous), ordinal_(o.device_ordinal) {
    STRATA_CUDA_CHECK(cudaSetDevice(ordinal_), "NCCL rank ", cfg_.rank, ": cuda device ", ordinal_);
    ncclUniqueId id{};
    if (cfg_.world_size == 1) {
      STRATA_NCCL_CHECK(ncclGetUniqueId(&id), "NCCL unique id");
    } else {
      store_ = open_run_store(cfg_);
      if (cfg_.rank == 0) {
        STRATA_NCCL_CHECK(ncclGetUniqueId(&id), "NCCL unique id");
        store_.store->set("nccl-id",
                          std::vector<char>(reinterpret_cast<char*>(&id), reinterpret_cast<char*>(&id) + sizeof id));
      }
      store_.store->wait({"nccl-id"}, cfg_.timeout);
      const auto bytes = store_.store->get("nccl-id");
      STRATA_CHECK(bytes.size() == sizeof id, Errc::comm, "NCCL unique id in the store has ", bytes.size(), " B, not ",
                   sizeof id);
      std::memcpy(&id, bytes.data(), sizeof id);
    }
    STRATA_NCCL_CHECK(ncclCommInitRank(&comm_, cfg_.world_size, id, cfg_.rank), "NCCL rank ", cfg_.rank, "/",
                      cfg_.world_size, " init");
    STRATA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "NCCL stream");
  }
  ~NcclCommunicator() override {
    cudaStreamSynchronize(stream_);
    ncclCommDestroy(comm_);
    cudaStreamDestroy(stream_);
  }

  int rank() const noexcept override { return cfg_.rank; }
  int world_size() const noexcept override { return cfg_.world_size; }
  Backend backend() const noexcept override { return Backend::nccl; }

  std::shared_ptr<Work> all_gather_async(const void* send, void* recv, std::size_t count, DType t) override {
    launch_all_gather(send, recv, count, t, stream_);
    return finish(str_cat("all_gather of ", count, " x ", dtype_name(t)));
  }
  std::shared_ptr<Work> all_gather_v_async(const void* send, void* recv, std::vector<std::size_t> counts,
                                           DType t) override {
    STRATA_CHECK(counts.size() == static_cast<std::size_t>(cfg_.world_size), Errc::invalid_argument,
                 "all_gather_v: ", counts.size(), " counts for a world of ", cfg_.world_size);
    const std::size_t es = dtype_size(t);
    std::size_t off = 0;
    STRATA_NCCL_CHECK(ncclGroupStart(), "all_gather_v");
    for (int r = 0; r < cfg_.world_size; ++r) {
      auto* dst = static_cast<char*>(recv) + off * es;
      if (r == cfg_.rank) {
        STRATA_CUDA_CHECK(cudaMemcpyAsync(dst, send, counts[r] * es, cudaMemcpyDefault, stream_), "all_gather_v");
      }
      STRATA_NCCL_CHECK(ncclBroadcast(r == cfg_.rank ? send : dst, dst, counts[r] * es, ncclUint8, r, comm_, stream_),
                        "all_gather_v");
      off += counts[r];
    }
    STRATA_NCCL_CHECK(ncclGroupEnd(), "all_gather_v");
    return finish("all_gather_v");
  }
  std::shared_ptr<Work> reduce_scatter_async(const void* send, void* recv, std::size_t count, DType t,
                                             ReduceOp op) override {
    launch_reduce_scatter(send, recv, count, t, op, stream_);
    return finish(str_cat("reduce_scatter of ", count, " x ", dtype_name(t)));
  }
  std::shared_ptr<Work> reduce_scatter_v_async(const void*, void*, std::vector<std::size_t>, DType, ReduceOp) override {
    STRATA_THROW(Errc::unsupported,
                 "reduce_scatter_v on NCCL: pad the buffer to a multiple of the world size and use "
                 "reduce_scatter (ZeRO's partitioner pads)");
  }
  std::shared_ptr<Work> all_reduce_async(void* buffer, std::size_t count, DType t, ReduceOp op) override {
    launch_all_reduce(buffer, count, t, op, stream_);
    return finish(str_cat("all_reduce of ", count, " x ", dtype_name(t)));
  }
  std::shared_ptr<Work> broadcast_async(void* buffer, std::size_t count, DType t, int root) override {
    STRATA_NCCL_CHECK(ncclBroadcast(buffer, buffer, count * dtype_size(t), ncclUint8, root, comm_, stream_),
                      "broadcast");
    return finish("broadcast");
  }
  std::shared_ptr<Work> send_async(const void* buffer, std::size_t bytes, int peer, int) override {
    STRATA_NCCL_CHECK(ncclSend(buffer, bytes, ncclUint8, peer, comm_, stream_), "send to rank ", peer);
    return finish(str_cat("send of ", bytes, " B to rank ", peer));
  }
  std::shared_ptr<Work> recv_async(void* buffer, std::size_t bytes, int peer, int) override {
    STRATA_NCCL_CHECK(ncclRecv(buffer, bytes, ncclUint8, peer, comm_, stream_), "recv from rank ", peer);
    return finish(str_cat("recv of ", bytes, " B from rank ", peer));
  }
  std::shared_ptr<Work> barrier_async() override {
    if (barrier_buf_ == nullptr) STRATA_CUDA_CHECK(cudaMalloc(&barrier_buf_, sizeof(float)), "barrier buffer");
    STRATA_NCCL_CHECK(ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclFloat32, ncclSum, comm_, stream_), "barrier");
    return finish("barrier");
  }

  void all_gather(const void* send, void* recv, std::size_t count, DType t, device::Stream& s) override {
    launch_all_gather(send, recv, count, t, cuda_stream(s));
  }
  void reduce_scatter(const void* send, void* recv, std::size_t count, DType t, ReduceOp op,
                      device::Stream& s) override {
    launch_reduce_scatter(send, recv, count, t, op, cuda_stream(s));
  }
  void all_reduce(void* buffer, std::size_t count, DType t, ReduceOp op, device::Stream& s) override {
    launch_all_reduce(buffer, count, t, op, cuda_stream(s));
  }
  void broadcast(void* buffer, std::size_t count, DType t, int root, device::Stream& s) override {
    STRATA_NCCL_CHECK(ncclBroadcast(buffer, buffer, count * dtype_size(t), ncclUint8, root, comm_, cuda_stream(s)),
                      "broadcast");
  }

 private:
  static cudaStream_t cuda_stream(device::Stream& s) {
    STRATA_CHECK(s.backend() == device::Backend::cuda, Errc::invalid_argument,
                 "NCCL collectives need a cuda stream, got a host stream");
    return static_cast<cudaStream_t>(s.native_handle());
  }
  void launch_all_gather(const void* send, void* recv, std::size_t count, DType t, cudaStream_t s) {
    STRATA_NCCL_CHECK(ncclAllGather(send, recv, count * dtype_size(t), ncclUint8, comm_, s), "all_gather");
  }
  // 16-bit reductions: widen to fp32 on the device, reduce, narrow once.
  void launch_reduce_scatter(const void* send, void* recv, std::size_t count, DType t, ReduceOp op, cudaStream_t s) {
    if (t == DType::fp32) {
      STRATA_NCCL_CHECK(ncclReduceScatter(send, recv, count, ncclFloat32, nccl_op(op), comm_, s), "reduce_scatter");
      return;
    }
    const std::size_t total = count * cfg_.world_size;
    float* wide = nullptr;
    STRATA_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&wide), (total + count) * sizeof(float), s),
                      "reduce_scatter scratch");
    device::detail::cuda_convert_async(s, send, t, wide, DType::fp32, total, true);
    STRATA_NCCL_CHECK(ncclReduceScatter(wide, wide + total, count, ncclFloat32, nccl_op(op), comm_, s),
                      "reduce_scatter");
    device::detail::cuda_convert_async(s, wide + total, DType::fp32, recv, t, count, true);
    STRATA_CUDA_CHECK(cudaFreeAsync(wide, s), "reduce_scatter scratch");
  }
  void launch_all_reduce(void* buffer, std::size_t count, DType t, ReduceOp op, cudaStream_t s) {
    if (t == DType::fp32) {
      STRATA_NCCL_CHECK(ncclAllReduce(buffer, buffer, count, ncclFloat32, nccl_op(op), comm_, s), "all_reduce");
      return;
    }
    float* wide = nullptr;
    STRATA_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&wide), count * sizeof(float), s), "all_reduce scratch");
    device::detail::cuda_convert_async(s, buffer, t, wide, DType::fp32, count, true);
    STRATA_NCCL_CHECK(ncclAllReduce(wide, wide, count, ncclFloat32, nccl_op(op), comm_, s), "all_reduce");
    device::detail::cuda_convert_async(s, wide, DType::fp32, buffer, t, count, true);
    STRATA_CUDA_CHECK(cudaFreeAsync(wide, s), "all_reduce scratch");
  }
  std::shared_ptr<Work> finish(const std::string& what) {
    cudaEvent_t e{};
    STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), what);
    STRATA_CUDA_CHECK(cudaEventRecord(e, stream_), what);
    return std::make_shared<NcclWork>(e, comm_, str_cat("rank ", cfg_.rank, "/", cfg_.world_size, ": ", what),
                                      cfg_.timeout);
  }

  RendezvousConfig cfg_;
  int ordinal_;
  RunStore store_;
  ncclComm_t comm_{};
  cudaStream_t stream_{};
  void* barrier_buf_ = nullptr;
};

}  // namespace

std::unique_ptr<Communicator> create_nccl(const CommOptions& options) {
  return std::make_unique<NcclCommunicator>(options);
}

}  // namespace strata::comm::detail
