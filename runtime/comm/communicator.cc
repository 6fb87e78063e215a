// Backend selection and the generic stream-ordered forms (a gated op per stream task).
#include "runtime/comm/communicator.h"

#include "runtime/comm/detail/gloo_backend.h"
#include "runtime/comm/detail/work.h"
#include "runtime/core/error.h"
#include "runtime/device/device.h"

namespace strata::comm {

std::unique_ptr<Communicator> Communicator::create(const CommOptions& options) {
  return options.backend == Backend::gloo ? detail::create_gloo(options) : detail::create_nccl(options);
}

namespace {
// Queues the op now (issue order) behind a gate that `stream` opens when it gets there;
// the stream then waits for the op, so later stream work sees the result.
template <class Issue> void stream_ordered(device::Stream& stream, Issue&& issue) {
  auto gate = std::make_shared<detail::Gate>();
  std::shared_ptr<Work> work;
  {
    detail::GateScope scope(gate);
    work = issue();
  }
  stream.launch_host([gate, work] {
    gate->open();
    work->wait();
  });
}
}  // namespace

void Communicator::all_gather(const void* send, void* recv, std::size_t count, DType t, device::Stream& stream) {
  stream_ordered(stream, [&] { return all_gather_async(send, recv, count, t); });
}
void Communicator::reduce_scatter(const void* send, void* recv, std::size_t count, DType t, ReduceOp op,
                                  device::Stream& stream) {
  stream_ordered(stream, [&] { return reduce_scatter_async(send, recv, count, t, op); });
}
void Communicator::all_reduce(void* buffer, std::size_t count, DType t, ReduceOp op, device::Stream& stream) {
  stream_ordered(stream, [&] { return all_reduce_async(buffer, count, t, op); });
}
void Communicator::broadcast(void* buffer, std::size_t count, DType t, int root, device::Stream& stream) {
  stream_ordered(stream, [&] { return broadcast_async(buffer, count, t, root); });
}

double mean_over_ranks(Communicator* comm, double value) {
  if (comm == nullptr || comm->world_size() == 1) return value;
  float v = static_cast<float>(value);
  comm->all_reduce(&v, 1, DType::fp32, ReduceOp::avg);
  return v;
}

}  // namespace strata::comm
