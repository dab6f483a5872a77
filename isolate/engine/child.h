// The engine's clone3 child (child.cc): pid 1 of the new pid namespace,
// from clone3 until it executes toolsandbox-init, which builds the sandbox
// (isolate/init/). It only moves itself into its cgroup leaf (v1), waits
// for its id maps, becomes the namespace's root and executes init:
// everything else happens in init's fresh address space, outside the root
// process.
//
// It runs between clone3 and execve in a copy of the engine, so: no
// allocation, no logging, no locks, async-signal-safe calls only. Every
// failure becomes one Report {stage, errno} on the report pipe, then _exit.
#pragma once

#include <cstddef>

#include "isolate/base/unique_fd.h"

namespace tsb::isolate {

// Prepared by the parent before clone3; only read by the child.
struct ChildStart {
  int sync_fd;     // read end: the parent writes kSyncMaps (then kSyncCgroup, for init)
  int sync_w_fd;   // the parent's write end, inherited: closed first, so EOF means the engine is gone
  int report_fd;   // write end of the report pipe
  int init_fd;     // toolsandbox-init, opened O_PATH by the engine
  int proc_fd;     // the engine's /proc, checked (open_proc_file)
  const int* keep;  // descriptors init gets (the plan names them), made inheritable here
  std::size_t nkeep;
  const UniqueFd* join;  // v1: the leaf's `tasks` files (CgroupLeaf::join_fds), close-on-exec
  std::size_t njoin;
  bool memfd_noexec;  // write vm.memfd_noexec=2 for the new pid namespace
  char report_arg[16];  // init's arguments: the report pipe's and the plan's descriptors
  char plan_arg[16];
};

// `path` (relative) beneath `proc`, the root of a procfs mount the engine
// checked once, opened for writing: no link, magic link or other mount
// crossed on the way (a mount over /proc/<pid>/... or a link in a fake tree
// cannot redirect a write of root's, the runc CVE-2025-52881 class), and
// the file itself on procfs (else EXDEV). -1 and errno on failure.
// Async-signal-safe: the engine and its child both write through it.
int open_proc_file(int proc, const char* path) noexcept;

// Entry point of the clone3 child. Never returns.
[[noreturn]] void child_main(const ChildStart& c) noexcept;

}  // namespace tsb::isolate
