// io_uring run-time probe (see probe.h).
#include "io/probe.h"

#include <liburing.h>
#include <sys/utsname.h>

#include <cstring>

namespace strata::io {

UringProbe probe_uring() {
  UringProbe p;
  utsname u{};
  if (uname(&u) == 0) p.kernel = u.release;
  io_uring ring{};
  const int rc = io_uring_queue_init(4, &ring, 0);
  if (rc < 0) {
    p.why = std::string("io_uring_queue_init: ") + (strerrorname_np(-rc) ? strerrorname_np(-rc) : "?") + " (" +
            std::strerror(-rc) + ")";
    return p;
  }
  p.available = true;
  if (io_uring_probe* probe = io_uring_get_probe_ring(&ring)) {
    const struct {
      int op;
      const char* name;
    } ops[] = {{IORING_OP_READ, "READ"},
               {IORING_OP_WRITE, "WRITE"},
               {IORING_OP_READ_FIXED, "READ_FIXED"},
               {IORING_OP_WRITE_FIXED, "WRITE_FIXED"},
               {IORING_OP_READV, "READV"},
               {IORING_OP_WRITEV, "WRITEV"},
               {IORING_OP_FSYNC, "FSYNC"},
               {IORING_OP_FALLOCATE, "FALLOCATE"}};
    for (const auto& o : ops) {
      if (io_uring_opcode_supported(probe, o.op)) p.opcodes.emplace_back(o.name);
    }
    io_uring_free_probe(probe);
  }
  io_uring_queue_exit(&ring);
  return p;
}

}  // namespace strata::io
