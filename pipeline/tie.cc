// A tied weight across stages (see tie.h).
#include "pipeline/tie.h"

#include <algorithm>

#include "runtime/core/error.h"

namespace strata::pipeline {

TiedStore::TiedStore(ParameterStore& inner, const PipelineModel& model, const std::vector<int>& held,
                     Transport* transport, int peer, std::uint32_t tag_base)
    : inner_(inner), model_(model), transport_(transport), peer_(peer), tag_base_(tag_base) {
  STRATA_CHECK(model.tie.has_value(), Errc::internal, "tied store over a model without a tie");
  tie_ = *model.tie;
  owner_ = std::find(held.begin(), held.end(), tie_.owner) != held.end();
  user_ = std::find(held.begin(), held.end(), tie_.user) != held.end();
  STRATA_CHECK((owner_ && user_) || ((owner_ || user_) && transport != nullptr && peer >= 0) || (!owner_ && !user_),
               Errc::internal, "tied store: layer ", owner_ ? tie_.user : tie_.owner,
               " is on another stage but no transport reaches it");
}

std::uint32_t TiedStore::tag(int micro) const {
  STRATA_CHECK(micro + 1 < (1 << 20), Errc::invalid_argument, "a tied weight's messages take up to 2^20 micro-batches");
  return tag_base_ + (static_cast<std::uint32_t>(step_ % 4) << 20) + static_cast<std::uint32_t>(micro + 1);
}

void TiedStore::begin_step() { begin(true); }
void TiedStore::begin_forward() { begin(false); }

void TiedStore::begin(bool step) {
  if (step) inner_.begin_step();
  ++step_;
  have_values_ = false;
  assembled_.clear();
  pending_.clear();
  if (!owner_) return;
  const Action read{ActionKind::forward, 0};
  inner_.before_action(read, {tie_.owner});
  const float* p = inner_.parameters(tie_.owner) + tie_.owner_offset;
  if (user_) {
    values_.assign(p, p + tie_.count);
    have_values_ = true;
  } else {
    transport_->send(peer_, tag(-1), p, tie_.count * sizeof(float));
  }
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
  if (assembled_.empty()) {  // once per step: layer code may still read it from an earlier call
    const std::size_t own = model_.stored_params(layer);
    const float* p = inner_.parameters(layer);
    assembled_.assign(p, p + own);
    assembled_.insert(assembled_.end(), values_.begin(), values_.end());
  }
  return assembled_.data();
}

void TiedStore::add_gradient(int layer, int micro, const float* dw) {
  if (layer == tie_.user) {
    const float* tail = dw + model_.stored_params(layer);
    if (owner_)
      pending_[micro].assign(tail, tail + tie_.count);
    else
      transport_->send(peer_, tag(micro), tail, tie_.count * sizeof(float));
    inner_.add_gradient(layer, micro, dw);
    return;
  }
  if (layer != tie_.owner) {
    inner_.add_gradient(layer, micro, dw);
    return;
  }
  const float* user_part = nullptr;
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
  user_part = incoming_.data();
  sum_.assign(dw, dw + model_.stored_params(layer));
  accumulate(sum_.data() + tie_.owner_offset, user_part, tie_.count);
  inner_.add_gradient(layer, micro, sum_.data());
}

void TiedStore::after_action(const Action& action, const std::vector<int>& layers) {
  inner_.after_action(action, layers);
}
void TiedStore::gradients_ready(int layer) { inner_.gradients_ready(layer); }
void TiedStore::optimizer_step() { inner_.optimizer_step(); }
float TiedStore::loss_scale() { return inner_.loss_scale(); }

}  // namespace strata::pipeline
