// A pipeline stage's hold on its device (see detail/stage_device.h).
#include "pipeline/detail/stage_device.h"

#include "runtime/core/error.h"
#include "runtime/device/pool_device.h"

namespace strata::pipeline::detail {

StageDevice::StageDevice(const ExecutorOptions& o, std::size_t work_floats, std::size_t staging_floats) {
  // Host code runs as stream work on a host device only; on CUDA the layers enqueue their own.
  const auto backend = o.shared_device != nullptr ? o.shared_device->backend() : o.device.backend;
  enqueues_ = backend == device::Backend::cuda;
  STRATA_CHECK(o.compute_threads >= 0, Errc::invalid_argument, "executor: compute_threads ", o.compute_threads,
               " must be >= 0");
  if (o.shared_device == nullptr) owned_ = device::Device::create(o.device);
  dev_ = o.shared_device != nullptr ? o.shared_device : owned_.get();
  scratch_ = o.scratch_device;
  stream_ = dev_->create_stream();
  staged_ = !device::cpu_reaches(*dev_);
  // A guarded device's stream runs each task on its worker alone, since TBB's threads may
  // not touch its memory; an arena's threads may not either.
  if (o.compute_threads > 0 && !staged_) arena_ = std::make_shared<tbb::task_arena>(o.compute_threads);
  if (work_floats > 0) work_ = alloc(work_floats, "pipeline layer work");
  if (staged_) host_ = device::PinnedBuffer(*dev_, staging_floats * sizeof(float), "pipeline host staging");
}

StageDevice::~StageDevice() { drain(); }

std::vector<std::shared_ptr<const Layer>> StageDevice::layers_of(const PipelineModel& model, const char* who) {
  if (!enqueues_) return model.layers;
  STRATA_CHECK(static_cast<bool>(model.bind), Errc::unsupported, who, " on ", dev_->name(),
               ": this model's layers are host code, which runs on the host device only; a CUDA stage runs a model "
               "that binds its layers to the stage's stream (PipelineModel::bind: the GPT's). Run this one on the "
               "host device");
  auto bound = model.bind(scratch_device(), *stream_);
  STRATA_CHECK(bound.size() == model.layers.size(), Errc::internal, who, ": the model bound ", bound.size(), " of its ",
               model.layers.size(), " layers");
  // The stage's pool was counted from the model's word (stage_memory) before this bind.
  for (std::size_t id = 0; id < bound.size(); ++id) {
    const std::size_t keeps = bound[id]->saved_floats(model.rows);
    const std::size_t said = model.saved_floats(static_cast<int>(id), device::Backend::cuda);
    STRATA_CHECK(keeps == said, Errc::internal, who, ": bound layer ", id, " (", bound[id]->name(), ") keeps ", keeps,
                 " floats between forward and backward, and the model said ", said,
                 " (PipelineModel::bound_saved_floats), which the stage's activation pool was sized by");
  }
  return bound;
}

device::Device& StageDevice::scratch_device() {
  if (scratch_ != nullptr) return *scratch_;
  if (auto* pool = dynamic_cast<device::PoolDevice*>(dev_)) return pool->parent();
  return *dev_;
}

void StageDevice::drain() noexcept {
  try {
    stream_->synchronize();
  } catch (...) {
  }
}

void StageDevice::launch(std::function<void()> fn) {
  if (arena_) {
    stream_->launch_host([a = arena_, fn = std::move(fn)] { a->execute(fn); });
  } else {
    stream_->launch_host(std::move(fn));
  }
}

void StageDevice::receive(Transport& t, int peer, std::uint32_t tag, void* into, std::size_t bytes) {
  if (!staged_) return t.recv(peer, tag, into, bytes);
  t.recv(peer, tag, host_.get(), bytes);
  stream_->copy_async(into, host_.get(), bytes, device::CopyKind::host_to_device);
  stream_->synchronize();
}

void StageDevice::send(Transport& t, int peer, std::uint32_t tag, const void* from, std::size_t bytes) {
  if (!staged_) return t.send(peer, tag, from, bytes);
  stream_->copy_async(host_.get(), from, bytes, device::CopyKind::device_to_host);
  stream_->synchronize();
  t.send(peer, tag, host_.get(), bytes);
}

}  // namespace strata::pipeline::detail
