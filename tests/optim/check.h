// Element-by-element comparison of a TestShard against reference results, collecting
// failures into one Catch2 assertion per step (a CHECK per element would drown the log).
#pragma once

#include <sstream>
#include <string>
#include <vector>

#include "tests/optim/reference.h"
#include "tests/optim/shard.h"

namespace strata::test {

struct Mismatches {
  std::size_t count = 0;
  std::string first;

  void check(const char* what, std::size_t i, double kernel, const Tracked& ref) {
    if (within(kernel, ref)) return;
    if (count++ == 0) {
      std::ostringstream os;
      os.precision(17);
      os << what << "[" << i << "] kernel " << kernel << " reference " << ref.x << " bound " << 2 * ref.err;
      first = os.str();
    }
  }
};

// Compares p (and the copy) and the state buffers `use` names against `ref` (the reference
// results of one step started from the shard's previous state).
inline void compare(const TestShard& sh, const std::vector<RefElem>& ref, optim::StateUse use, Mismatches& out) {
  const ShardSpec& s = sh.spec();
  for (std::size_t i = 0; i < sh.size(); ++i) {
    out.check("p", i, sh.p(i), ref[i].p);
    if (use.m) out.check("m", i, sh.m(i), {ref[i].m.x, ref[i].m.err + storage_error(s.state, ref[i].m)});
    if (use.v) out.check("v", i, sh.v(i), {ref[i].v.x, ref[i].v.err + storage_error(s.state, ref[i].v)});
    if (s.copy) out.check("copy", i, sh.copy(i), {ref[i].p.x, ref[i].p.err + storage_error(s.copy_dtype, ref[i].p)});
  }
}

}  // namespace strata::test
