// A pipeline stage's hold on its device (private to pipeline/), shared by the executor's
// steps (executor.cc) and its forward-only passes (forward.cc): the device (the caller's,
// or one made from the options), one stream, the layers' work buffer and, where the CPU
// cannot reach the device's memory (device::cpu_reaches), one pinned staging buffer through
// which host data moves with copies in stream order. On a host device the stream runs the
// layer code as host "kernels" (in a TBB arena of the stage's own with compute_threads > 0,
// where the CPU reaches the device's memory; a guarded device's stream runs them on its
// worker alone); on CUDA the layers, bound to the stream (PipelineModel::bind), enqueue
// their own work from the stage's thread. layers_of() gives a model's layers as the stage
// calls them (bound or not); launch_layer() calls one as applies. receive() and send()
// move a tensor between the transport and a device buffer: straight, or staged and waited
// for (the next transfer reuses the staging buffer). Declare a StageDevice before
// every buffer it allocates, so that those go first, and drain() it before they go, so that
// queued layer work never outlives the buffers it uses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <tbb/task_arena.h>

#include "pipeline/executor.h"
#include "pipeline/model.h"
#include "pipeline/transport.h"
#include "runtime/device/device.h"

namespace strata::pipeline::detail {

class StageDevice {
 public:
  // `work_floats`: the layers' scratch; `staging_floats`: the largest host transfer (used
  // only where the CPU cannot reach the device).
  StageDevice(const ExecutorOptions& options, std::size_t work_floats, std::size_t staging_floats);
  ~StageDevice();
  StageDevice(const StageDevice&) = delete;
  StageDevice& operator=(const StageDevice&) = delete;

  device::Device& dev() { return *dev_; }
  // Where bound layers keep their compute state: the options' scratch_device, else the
  // device a pool (the stage's activations) was cut from, or the stage's device.
  device::Device& scratch_device();
  device::Stream& stream() { return *stream_; }
  // `model`'s layers as this stage calls them: bound to stream() where the layers enqueue
  // their own work, else model.layers. A model whose layers are host code (no bind) is
  // refused there, naming `who` and the device.
  std::vector<std::shared_ptr<const Layer>> layers_of(const PipelineModel& model, const char* who);
  bool staged() const noexcept { return staged_; }
  float* work() const noexcept { return work_.as<float>(); }
  float* host() const noexcept { return host_.as<float>(); }  // staged only
  device::DeviceBuffer alloc(std::size_t floats, const char* what) {
    return device::DeviceBuffer(*dev_, floats * sizeof(float), what);
  }
  // Waits for the stream, swallowing a layer's error (for destructors, after a failure).
  void drain() noexcept;
  // Queues `fn` on the stream (in the arena, if any).
  void launch(std::function<void()> fn);
  // A layer call: made now where the layers enqueue their own work, else launch()ed.
  void launch_layer(std::function<void()> fn) {
    if (enqueues_)
      fn();
    else
      launch(std::move(fn));
  }
  // `bytes` from the transport into `into` / from `from` to the transport.
  void receive(Transport& t, int peer, std::uint32_t tag, void* into, std::size_t bytes);
  void send(Transport& t, int peer, std::uint32_t tag, const void* from, std::size_t bytes);

 private:
  std::unique_ptr<device::Device> owned_;
  device::Device* dev_ = nullptr;
  device::Device* scratch_ = nullptr;  // the options' scratch_device
  std::unique_ptr<device::Stream> stream_;
  std::shared_ptr<tbb::task_arena> arena_;
  device::DeviceBuffer work_;
  bool staged_ = false;
  bool enqueues_ = false;
  device::PinnedBuffer host_;
};

}  // namespace strata::pipeline::detail
