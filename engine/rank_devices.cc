// A rank's device and device communicator (see rank_devices.h).
#include "engine/rank_devices.h"

namespace strata::engine {

device::Backend choose_backend(std::string_view name, int world_size) {
  if (name != "auto") return device::parse_backend(name);
  const auto gpus = device::cuda_inventory().devices.size();
  return gpus >= static_cast<std::size_t>(world_size) ? device::Backend::cuda : device::Backend::host;
}

std::unique_ptr<comm::Communicator> create_device_comm(const comm::CommOptions& host, device::Backend backend,
                                                       int ordinal) {
  if (host.rendezvous.world_size <= 1 || backend != device::Backend::cuda) return nullptr;
  comm::CommOptions o = host;
  o.backend = comm::Backend::nccl;
  o.device_ordinal = ordinal;
  o.rendezvous.run_id += ".nccl";
  return comm::Communicator::create(o);
}

}  // namespace strata::engine
