// The seccomp program a sandbox loads: plain data. The engine never reads a
// profile: programs are compiled from policies by the policy language
// (daemon/policy/seccomp_profile.h) and handed over ready to load (the load
// is the last step before execve; see isolate/init/tool.cc).
#pragma once

#include <linux/filter.h>

#include <string>
#include <vector>

namespace tsb::isolate {

// A compiled, ready-to-load classic BPF program. Immutable once built;
// shared by every run of the policy that compiled it.
struct SeccompProgram {
  std::string name;                // profile source, for messages
  std::vector<sock_filter> insns;  // the program, as seccomp(2) takes it
  std::string sha256;              // hex digest of the instruction bytes

  sock_fprog fprog() const noexcept {
    return sock_fprog{static_cast<unsigned short>(insns.size()), const_cast<sock_filter*>(insns.data())};
  }
};

}  // namespace tsb::isolate
