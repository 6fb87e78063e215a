// Ranks: which of the data-parallel ranks this engine is and how many there are, with the
// communicator between them (null: one rank) and the one for device-memory collectives
// (EngineOptions::device_comm, null without one). A value the engine holds once and hands to
// the parts that talk to other ranks.
#pragma once

#include "runtime/comm/communicator.h"

namespace strata::engine {

struct Ranks {
  comm::Communicator* comm = nullptr;
  int rank = 0, world = 1;
  comm::Communicator* dcomm = nullptr;
};

}  // namespace strata::engine
