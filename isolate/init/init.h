// toolsandbox-init's parts: building the sandbox from its plan (build.cc),
// the tool process (tool.cc), pid 1 (init.cc). libc only; every failure is
// one Report {stage, errno} on the report pipe (isolate/engine/stage.h), then exit.
#pragma once

#include <errno.h>
#include <unistd.h>

#include "isolate/init/plan_reader.h"
#include "isolate/engine/stage.h"

namespace tsb::isolate::init {

// Closes a descriptor when it goes out of scope, keeping errno.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd < 0) return;
    const int saved = errno;
    ::close(fd);
    errno = saved;
  }
};

// Writes one set-up error report on `report_fd` (naming the plan's step
// that failed, when one did) and _exit(code).
[[noreturn]] void fail_at(int report_fd, Stage stage, int err, int code, int step = -1) noexcept;

// From inside the sandbox's namespaces, as their root: the plan's steps,
// the hostname, lo, pivot_root, / read-only, the cgroup leaf (waits for the
// engine's kSyncCgroup) and a cgroup namespace rooted at it. Fails closed.
void build_sandbox(const Plan& plan) noexcept;

// The tool process, forked by pid 1 once the file system is final: drops
// every privilege, waits for `ready_fd` (EOF: pid 1 runs with its filter
// loaded; a byte: the sandbox is being torn down), loads the tool's filter
// and executes the tool with `end_fd` (the end note's write end, or -1:
// init.cc) as its fd 3. Never returns.
[[noreturn]] void tool_main(const Plan& plan, int ready_fd, int end_fd) noexcept;

// Privilege steps shared by pid 1 and the tool; each returns 0 or -1 with
// errno set. Securebits locked (so no exec of a uid-0 program grants
// capabilities again), the bounding and ambient sets emptied, every
// capability set cleared (verified), and the death signal, which the kernel
// clears at every change of the effective ids.
int lock_securebits() noexcept;
int drop_bounding_set() noexcept;
int clear_caps() noexcept;
int arm_death_signal() noexcept;

// write(2) all of a small buffer, retrying on EINTR only.
bool write_all(int fd, const void* buf, unsigned long len) noexcept;

}  // namespace tsb::isolate::init
