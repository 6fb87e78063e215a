// See bench_child.h.
#include "train/bench_child.h"

#include <unistd.h>

#include <cstdio>

#include "runtime/core/error.h"

namespace strata::train {

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string this_executable(const char* who) {
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  STRATA_CHECK(n > 0, Errc::io, who, ": cannot find this executable (/proc/self/exe)");
  self[n] = '\0';
  return self;
}

std::string run_strata(const std::string& exe, const std::string& args, const char* who) {
  const std::string cmd = shell_quote(exe) + " " + args;
  FILE* p = ::popen(cmd.c_str(), "r");
  STRATA_CHECK(p != nullptr, Errc::io, who, ": cannot run '", cmd, "'");
  std::string out;
  char buf[4096];
  for (std::size_t got; (got = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, got);
  const int rc = ::pclose(p);
  STRATA_CHECK(rc == 0, Errc::io, who, ": '", cmd, "' failed (status ", rc, "): ", out);
  return out;
}

nlohmann::json run_strata_json(const std::string& exe, const std::string& args, const char* who) {
  return nlohmann::json::parse(run_strata(exe, args, who));
}

std::string run_self(const std::string& args, const char* who) { return run_strata(this_executable(who), args, who); }

nlohmann::json run_self_json(const std::string& args, const char* who) {
  return nlohmann::json::parse(run_self(args, who));
}

}  // namespace strata::train
