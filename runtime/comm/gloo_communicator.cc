// The Gloo backend: CPU ranks (processes or threads) over TCP. Collectives are Gloo's own
// (ring all-reduce, all-gather(v), broadcast, barrier); reduce-scatter is Gloo's all-reduce
// followed by taking this rank's slice, because Gloo's current API has no reduce-scatter,
// and because it gives all-reduce and reduce-scatter one reduction order, so ZeRO stages
// that use either produce bitwise-identical sums. It costs twice a true reduce-scatter's
// traffic on CPU ranks; the NCCL backend uses ncclReduceScatter.
#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/types.h>

#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <numeric>
#include <thread>
#include <vector>

#include "runtime/comm/detail/gloo_backend.h"
#include "runtime/comm/detail/op_queue.h"
#include "runtime/comm/detail/store.h"
#include "runtime/core/error.h"
#include "runtime/core/log.h"

namespace strata::comm::detail {
namespace {

using Clock = std::chrono::steady_clock;

// Gloo failures become strata errors: a timeout or a peer that went away, with the peers
// that the beacons show dead, stopped or silent (`watch` is null for a world of one).
[[noreturn]] void rethrow_gloo(const std::exception& e, std::chrono::milliseconds timeout, const PeerWatch* watch) {
  const std::string what = e.what();
  const bool timed_out = what.find("imed out") != std::string::npos || what.find("imeout") != std::string::npos;
  const std::string peers = watch != nullptr ? watch->diagnose() : std::string();
  STRATA_THROW(timed_out ? Errc::timeout : Errc::comm, timed_out ? "no answer within " : "failed (",
               timed_out ? std::to_string(timeout.count()) + " ms" : what, timed_out ? " (" + what + ")" : ")", ". ",
               peers.empty() ? "Every other rank is alive and beating: the network between the ranks failed, or a "
                               "rank issued a different collective (every rank must issue the same collectives in "
                               "the same order)"
                             : "The cause: " + peers);
}

// A peer that dies mid-transfer must become an error, not kill this process: Gloo writes
// to its sockets without MSG_NOSIGNAL on some paths, and SIGPIPE's default action is to
// terminate. Only a default handler is replaced; a program's own handler is left alone.
void ignore_sigpipe() {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) signal(SIGPIPE, SIG_IGN);
}

// STRATA_COMM_IFACE, else Gloo's and PyTorch's GLOO_SOCKET_IFNAME; empty: loopback.
std::string interface_from_env() {
  for (const char* name : {"STRATA_COMM_IFACE", "GLOO_SOCKET_IFNAME"}) {
    const char* v = std::getenv(name);
    if (v != nullptr && *v != '\0') return v;
  }
  return {};
}

std::vector<std::size_t> prefix_offsets(const std::vector<std::size_t>& counts) {
  std::vector<std::size_t> off(counts.size() + 1, 0);
  std::partial_sum(counts.begin(), counts.end(), off.begin() + 1);
  return off;
}

// A posted send or receive; wait() blocks on the transfer in the caller's thread. test()
// reports true once wait() has returned (Gloo offers no non-blocking poll).
class P2PWork final : public Work {
 public:
  P2PWork(std::unique_ptr<gloo::transport::UnboundBuffer> buf, bool is_send, std::string what,
          std::chrono::milliseconds timeout, const PeerWatch* watch)
      : buf_(std::move(buf)), is_send_(is_send), what_(std::move(what)), timeout_(timeout), watch_(watch) {}
  void wait() override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (done_) {
      if (error_) std::rethrow_exception(error_);
      return;
    }
    try {
      try {
        const bool ok = is_send_ ? buf_->waitSend(timeout_) : buf_->waitRecv(timeout_);
        if (!ok) STRATA_THROW(Errc::comm, "aborted");
      } catch (const Error&) {
        throw;
      } catch (const std::exception& e) {
        rethrow_gloo(e, timeout_, watch_);
      }
    } catch (const Error& e) {
      error_ = std::make_exception_ptr(Error(e.code(), what_ + ": " + e.what(), e.where()));
    }
    done_ = true;
    if (error_) std::rethrow_exception(error_);
  }
  bool test() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return done_;
  }

 private:
  std::mutex mutex_;
  std::unique_ptr<gloo::transport::UnboundBuffer> buf_;
  bool is_send_;
  std::string what_;
  std::chrono::milliseconds timeout_;
  const PeerWatch* watch_;
  bool done_ = false;
  std::exception_ptr error_;
};

class GlooCommunicator final : public Communicator {
 public:
  explicit GlooCommunicator(const CommOptions& o) : cfg_(o.rendezvous) {
    STRATA_CHECK(cfg_.world_size >= 1 && cfg_.rank >= 0 && cfg_.rank < cfg_.world_size, Errc::invalid_argument, "rank ",
                 cfg_.rank, " / world size ", cfg_.world_size, " is not a valid rank");
    if (cfg_.world_size == 1) return;  // nothing to connect; ops are local copies
    ignore_sigpipe();
    try {
      store_ = open_run_store(cfg_);
      gloo::transport::tcp::attr attr;
      const std::string iface = !o.interface.empty() ? o.interface : interface_from_env();
      if (iface.empty())
        attr.hostname = "127.0.0.1";
      else
        attr.iface = iface;
      device_ = gloo::transport::tcp::CreateDevice(attr);
      context_ = std::make_shared<gloo::rendezvous::Context>(cfg_.rank, cfg_.world_size);
      context_->setTimeout(cfg_.timeout);
      context_->connectFullMesh(*store_.store, device_);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      STRATA_THROW(Errc::comm, "rank ", cfg_.rank, "/", cfg_.world_size, ": connecting to the other ranks through '",
                   cfg_.path, "' failed: ", e.what());
    }
  }

  ~GlooCommunicator() override {
    queue_.reset();  // drain ops before the context goes
  }

  int rank() const noexcept override { return cfg_.rank; }
  int world_size() const noexcept override { return cfg_.world_size; }
  Backend backend() const noexcept override { return Backend::gloo; }

  std::shared_ptr<Work> all_gather_async(const void* send, void* recv, std::size_t count, DType t) override {
    return all_gather_v_async(send, recv, std::vector<std::size_t>(cfg_.world_size, count), t);
  }

  std::shared_ptr<Work> all_gather_v_async(const void* send, void* recv, std::vector<std::size_t> counts,
                                           DType t) override {
    check_counts(counts, "all_gather_v");
    const std::size_t es = dtype_size(t);
    const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
    const std::uint32_t tag = queue_->next_tag();
    return queue_->submit(describe("all_gather", tag, total, t), [=, this] {
      const auto off = prefix_offsets(counts);
      auto* out = static_cast<std::uint8_t*>(recv);
      if (send != out + off[cfg_.rank] * es) std::memmove(out + off[cfg_.rank] * es, send, counts[cfg_.rank] * es);
      if (cfg_.world_size == 1 || total == 0) return;
      std::vector<std::size_t> bytes(counts.size());
      for (std::size_t r = 0; r < counts.size(); ++r) bytes[r] = counts[r] * es;
      guarded([&] {
        gloo::AllgathervOptions opts(context_);
        opts.setOutput<std::uint8_t>(out, bytes);  // in place: our part is already there
        opts.setTag(tag);
        opts.setTimeout(cfg_.timeout);
        gloo::allgatherv(opts);
      });
    });
  }

  std::shared_ptr<Work> reduce_scatter_async(const void* send, void* recv, std::size_t count, DType t,
                                             ReduceOp op) override {
    return reduce_scatter_v_async(send, recv, std::vector<std::size_t>(cfg_.world_size, count), t, op);
  }

  std::shared_ptr<Work> reduce_scatter_v_async(const void* send, void* recv, std::vector<std::size_t> counts, DType t,
                                               ReduceOp op) override {
    check_counts(counts, "reduce_scatter_v");
    check_reducible(t, "reduce_scatter");
    const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
    const std::uint32_t tag = queue_->next_tag();
    return queue_->submit(describe("reduce_scatter", tag, total, t, op), [=, this] {
      const auto off = prefix_offsets(counts);
      std::vector<float> acc(total);
      convert(send, t, acc.data(), DType::fp32, total);
      reduce_fp32(acc.data(), total, op, tag);
      convert(acc.data() + off[cfg_.rank], DType::fp32, recv, t, counts[cfg_.rank]);
    });
  }

  std::shared_ptr<Work> all_reduce_async(void* buffer, std::size_t count, DType t, ReduceOp op) override {
    check_reducible(t, "all_reduce");
    const std::uint32_t tag = queue_->next_tag();
    return queue_->submit(describe("all_reduce", tag, count, t, op), [=, this] {
      if (t == DType::fp32) {
        reduce_fp32(static_cast<float*>(buffer), count, op, tag);
        return;
      }
      std::vector<float> acc(count);  // 16-bit sums accumulate in fp32
      convert(buffer, t, acc.data(), DType::fp32, count);
      reduce_fp32(acc.data(), count, op, tag);
      convert(acc.data(), DType::fp32, buffer, t, count);
    });
  }

  std::shared_ptr<Work> broadcast_async(void* buffer, std::size_t count, DType t, int root) override {
    STRATA_CHECK(root >= 0 && root < cfg_.world_size, Errc::invalid_argument, "broadcast root ", root,
                 " is not a rank of a world of ", cfg_.world_size);
    const std::uint32_t tag = queue_->next_tag();
    return queue_->submit(describe("broadcast", tag, count, t), [=, this] {
      if (cfg_.world_size == 1 || count == 0) return;
      guarded([&] {
        gloo::BroadcastOptions opts(context_);
        opts.setOutput<std::uint8_t>(static_cast<std::uint8_t*>(buffer), count * dtype_size(t));
        opts.setRoot(root);
        opts.setTag(tag);
        opts.setTimeout(cfg_.timeout);
        gloo::broadcast(opts);
      });
    });
  }

  std::shared_ptr<Work> send_async(const void* buffer, std::size_t bytes, int peer, int tag) override {
    return p2p(const_cast<void*>(buffer), bytes, peer, tag, true);
  }
  std::shared_ptr<Work> recv_async(void* buffer, std::size_t bytes, int peer, int tag) override {
    return p2p(buffer, bytes, peer, tag, false);
  }

  std::shared_ptr<Work> barrier_async() override {
    const std::uint32_t tag = queue_->next_tag();
    return queue_->submit(describe("barrier", tag, 0, DType::fp32), [=, this] {
      if (cfg_.world_size == 1) return;
      guarded([&] {
        gloo::BarrierOptions opts(context_);
        opts.setTag(tag);
        opts.setTimeout(cfg_.timeout);
        gloo::barrier(opts);
      });
    });
  }

 private:
  // Point-to-point ops do not queue behind collectives: a send and the matching receive
  // must both be posted for either to finish, so they are posted at once and their Work
  // waits on the transfer. Gloo slots for p2p use a prefix no collective uses.
  std::shared_ptr<Work> p2p(void* buffer, std::size_t bytes, int peer, int tag, bool is_send) {
    STRATA_CHECK(peer >= 0 && peer < cfg_.world_size && peer != cfg_.rank, Errc::invalid_argument,
                 is_send ? "send" : "recv", " peer ", peer, " is not another rank of a world of ", cfg_.world_size);
    STRATA_CHECK(tag >= 0, Errc::invalid_argument, "p2p tag ", tag, " must be >= 0");
    const std::string what = str_cat("rank ", cfg_.rank, "/", cfg_.world_size, ": ", is_send ? "send to" : "recv from",
                                     " rank ", peer, " of ", bytes, " B (tag ", tag, ")");
    if (bytes == 0) {
      auto done = std::make_shared<OpWork>();
      done->finish(nullptr);
      return done;
    }
    const std::uint64_t slot = (std::uint64_t{0x7f} << 56) | static_cast<std::uint32_t>(tag);
    std::unique_ptr<gloo::transport::UnboundBuffer> buf;
    try {
      buf = context_->createUnboundBuffer(buffer, bytes);
      if (is_send)
        buf->send(peer, slot);
      else
        buf->recv(peer, slot);
    } catch (const std::exception& e) {
      STRATA_THROW(Errc::comm, what, ": ", e.what());
    }
    return std::make_shared<P2PWork>(std::move(buf), is_send, what, cfg_.timeout, store_.watch.get());
  }

  void reduce_fp32(float* data, std::size_t count, ReduceOp op, std::uint32_t tag) {
    if (cfg_.world_size > 1 && count > 0) {
      guarded([&] {
        gloo::AllreduceOptions opts(context_);
        opts.setOutput<float>(data, count);
        using Fn = void (*)(void*, const void*, const void*, std::size_t);
        opts.setReduceFunction(op == ReduceOp::max ? static_cast<Fn>(&gloo::max<float>)
                                                   : static_cast<Fn>(&gloo::sum<float>));
        opts.setTag(tag);
        opts.setTimeout(cfg_.timeout);
        gloo::allreduce(opts);
      });
    }
    if (op == ReduceOp::avg) {
      const float n = static_cast<float>(cfg_.world_size);
      for (std::size_t i = 0; i < count; ++i) data[i] /= n;
    }
  }

  template <class F> void guarded(F&& f) {
    try {
      f();
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      rethrow_gloo(e, cfg_.timeout, store_.watch.get());
    }
  }

  void check_counts(const std::vector<std::size_t>& counts, const char* op) const {
    STRATA_CHECK(counts.size() == static_cast<std::size_t>(cfg_.world_size), Errc::invalid_argument, op, ": ",
                 counts.size(), " counts given for a world of ", cfg_.world_size, " ranks");
  }
  static void check_reducible(DType t, const char* op) {
    STRATA_CHECK(t == DType::fp32 || t == DType::bf16 || t == DType::fp16, Errc::invalid_argument, op, " of ",
                 dtype_name(t), ": reductions take fp32, bf16 or fp16");
  }
  std::string describe(const char* op, std::uint32_t tag, std::size_t count, DType t) const {
    return str_cat("rank ", cfg_.rank, "/", cfg_.world_size, ": ", op, " #", tag, " of ", count, " x ", dtype_name(t));
  }
  std::string describe(const char* op, std::uint32_t tag, std::size_t count, DType t, ReduceOp r) const {
    return describe(op, tag, count, t) + " (" + reduce_op_name(r) + ")";
  }

  RendezvousConfig cfg_;
  RunStore store_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  std::unique_ptr<OpQueue> queue_ = std::make_unique<OpQueue>();
};

}  // namespace

std::unique_ptr<Communicator> create_gloo(const CommOptions& options) {
  return std::make_unique<GlooCommunicator>(options);
}

}  // namespace strata::comm::detail
