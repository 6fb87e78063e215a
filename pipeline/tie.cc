// A tied weight across stages (see tie.h).
#include "pipeline/tie.h"

#include <algorithm>
#include <cstring>

#include "runtime/core/error.h"
#include "runtime/device/ops.h"

namespace strata::pipeline {
namespace {

// The floats of the user's assembled parameters (its own, then the tied values), of the
// owner's summed gradient, and of the user's part of it.
struct TieFloats {
  std::size_t assembled, sum, part;
};
TieFloats tie_floats(const PipelineModel& model) {
  const Tie& t = *model.tie;
  return {model.layers[t.user]->param_count(), model.stored_params(t.owner), t.count};
}

}  // namespace

TiedStore::TiedStore(ParameterStore& inner, const PipelineModel& model, const std::vector<int>& held,
                     Transport* transport, int peer, std::uint32_t tag_base, device::Device* dev)
    : inner_(inner), model_(model), transport_(transport), peer_(peer), tag_base_(tag_base), dev_(dev) {
  STRATA_CHECK(model.tie.has_value(), Errc::internal, "tied store over a model without a tie");
  tie_ = *model.tie;
  owner_ = std::find(held.begin(), held.end(), tie_.owner) != held.end();
  user_ = std::find(held.begin(), held.end(), tie_.user) != held.end();
  STRATA_CHECK((owner_ && user_) || ((owner_ || user_) && transport != nullptr && peer >= 0) || (!owner_ && !user_),
               Errc::internal, "tied store: layer ", owner_ ? tie_.user : tie_.owner,
               " is on another stage but no transport reaches it");
  const TieFloats f = tie_floats(model);
  if (dev_ != nullptr) {
    stream_ = dev_->create_stream();
    if (user_)
      assembled_buf_ = device::DeviceBuffer(*dev_, f.assembled * sizeof(float), "tied weight's user parameters");
    if (owner_) {
      sum_buf_ = device::DeviceBuffer(*dev_, f.sum * sizeof(float), "tied weight's summed gradient");
      part_buf_ = device::DeviceBuffer(*dev_, f.part * sizeof(float), "tied weight's user gradient");
    }
    assembled_ = assembled_buf_.as<float>();
    sum_ = sum_buf_.as<float>();
    part_ = part_buf_.as<float>();
  } else {
    if (user_) assembled_host_.resize(f.assembled);
    if (owner_) sum_host_.resize(f.sum);
    assembled_ = assembled_host_.data();
    sum_ = sum_host_.data();
  }
}

TiedStore::~TiedStore() {
  if (stream_) {
    try {
      stream_->synchronize();  // the buffers go first
    } catch (...) {
    }
  }
}

std::vector<std::size_t> TiedStore::device_floats(const PipelineModel& model, const std::vector<int>& held) {
  std::vector<std::size_t> out;
  if (!model.tie) return out;
  const Tie& t = *model.tie;
  const TieFloats f = tie_floats(model);
  if (std::find(held.begin(), held.end(), t.user) != held.end()) out.push_back(f.assembled);
  if (std::find(held.begin(), held.end(), t.owner) != held.end()) out.insert(out.end(), {f.sum, f.part});
  return out;
}

std::uint32_t TiedStore::tag(int micro) const {
  STRATA_CHECK(micro + 1 < (1 << 20), Errc::invalid_argument, "a tied weight's messages take up to 2^20 micro-batches");
  return tag_base_ + (static_cast<std::uint32_t>(step_ % 4) << 20) + static_cast<std::uint32_t>(micro + 1);
}

void TiedStore::copy(void* dst, const void* src, std::size_t bytes, device::CopyKind kind) {
  if (stream_)
    stream_->copy_async(dst, src, bytes, kind);
  else
    std::memcpy(dst, src, bytes);
}

void TiedStore::wait() {
  if (stream_) stream_->synchronize();
}

void TiedStore::begin_step() { begin(true); }
void TiedStore::begin_forward() { begin(false); }

void TiedStore::begin(bool step) {
  if (step) inner_.begin_step();
  ++step_;
  have_values_ = false;
  assembled_this_step_ = false;
  pending_.clear();
  if (!owner_) return;
  const Action read{ActionKind::forward, 0};
  inner_.before_action(read, {tie_.owner});
  values_.resize(tie_.count);
  copy(values_.data(), inner_.parameters(tie_.owner) + tie_.owner_offset, tie_.count * sizeof(float),
       device::CopyKind::device_to_host);
  wait();
  if (user_)
    have_values_ = true;
  else
    transport_->send(peer_, tag(-1), values_.data(), tie_.count * sizeof(float));
  inner_.after_action(read, {tie_.owner});
}

void TiedStore::before_action(const Action& action, const std::vector<int>& layers) {
  inner_.before_action(action, layers);
}

const float* TiedStore::parameters(int layer) {
  if (layer != tie_.user) return inner_.parameters(layer);
  if (!have_values_) {
    values_.resize(tie_.count);
    transport_->recv(peer_, tag(-1), values_.data(), tie_.count * sizeof(float));
    have_values_ = true;
  }
  if (!assembled_this_step_) {  // once per step: layer code may still read it from an earlier call
    const std::size_t own = model_.stored_params(layer);
    copy(assembled_, inner_.parameters(layer), own * sizeof(float), device::CopyKind::device_to_device);
    copy(assembled_ + own, values_.data(), tie_.count * sizeof(float), device::CopyKind::host_to_device);
    wait();
    assembled_this_step_ = true;
  }
  return assembled_;
}

void TiedStore::add_gradient(int layer, int micro, const float* dw) {
  if (layer == tie_.user) {
    auto& tail = owner_ ? pending_[micro] : outgoing_;
    tail.resize(tie_.count);
    copy(tail.data(), dw + model_.stored_params(layer), tie_.count * sizeof(float), device::CopyKind::device_to_host);
    wait();
    if (!owner_) transport_->send(peer_, tag(micro), tail.data(), tie_.count * sizeof(float));
    inner_.add_gradient(layer, micro, dw);
    return;
  }
  if (layer != tie_.owner) {
    inner_.add_gradient(layer, micro, dw);
    return;
  }
  if (user_) {
    const auto it = pending_.find(micro);
    STRATA_CHECK(it != pending_.end(), Errc::internal, "tied store: layer ", tie_.owner, "'s gradient of micro-batch ",
                 micro, " came before layer ", tie_.user, "'s");
    incoming_ = std::move(it->second);
    pending_.erase(it);
  } else {
    incoming_.resize(tie_.count);
    transport_->recv(peer_, tag(micro), incoming_.data(), tie_.count * sizeof(float));
  }
  // owner + user, element by element (the same fp32 additions on every backend).
  copy(sum_, dw, model_.stored_params(layer) * sizeof(float), device::CopyKind::device_to_device);
  if (stream_) {
    stream_->copy_async(part_, incoming_.data(), tie_.count * sizeof(float), device::CopyKind::host_to_device);
    device::accumulate_async(*stream_, sum_ + tie_.owner_offset, part_, DType::fp32, tie_.count);
    wait();
  } else {
    accumulate(sum_ + tie_.owner_offset, incoming_.data(), tie_.count);
  }
  inner_.add_gradient(layer, micro, sum_);
}

void TiedStore::after_action(const Action& action, const std::vector<int>& layers) {
  inner_.after_action(action, layers);
}
void TiedStore::gradients_ready(int layer) { inner_.gradients_ready(layer); }
void TiedStore::optimizer_step() { inner_.optimizer_step(); }
float TiedStore::loss_scale() { return inner_.loss_scale(); }

}  // namespace strata::pipeline
