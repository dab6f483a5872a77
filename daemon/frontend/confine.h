// The front end's own confinement (docs/SECURITY.md, "The front end").
#pragma once

#include "isolate/base/result.h"

namespace tsb::frontend {

// Refuses a process that could act with privilege: uid or gid 0 (real,
// effective or saved), any capability in any set, no no_new_privs.
Status check_unprivileged();

// The front end's seccomp filter: everything it does is allowed (sockets,
// files, threads of libcurl's resolver); what only an attacker would do is
// refused with EPERM: new processes (threads only), new namespaces, mounts,
// ptrace and other processes' memory, exec, kernel modules and keys, BPF,
// perf, io_uring, clocks.
Status load_front_end_filter();

}  // namespace tsb::frontend
