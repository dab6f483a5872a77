// The tool process: forked by the sandbox's pid 1 once the file system is
// final, it drops every privilege and executes the tool. Same rules as
// child_sandbox.cc: allocation-free, async-signal-safe, fail closed.
// The order matters and each step says why it sits where it does.
#include <fcntl.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>

#include "isolate/child.h"
#include "isolate/child_common.h"

namespace tsb::isolate {
namespace {

// execve(argv[0]) or, without a '/', each PATH entry in turn like execvp,
// but without allocating: candidates are built in a stack buffer.
int exec_tool(const ChildPlan& plan) noexcept {
  const char* file = plan.argv[0];
  char* const* argv = const_cast<char* const*>(plan.argv);
  char* const* envp = const_cast<char* const*>(plan.envp);
  if (std::strchr(file, '/') != nullptr) {
    ::execve(file, argv, envp);
    return errno;
  }
  std::size_t flen = std::strlen(file);
  int result = ENOENT;
  const char* p = plan.path_search;
  char buf[4096];
  while (p != nullptr && *p != '\0') {
    const char* end = std::strchr(p, ':');
    std::size_t dlen = end ? static_cast<std::size_t>(end - p) : std::strlen(p);
    if (dlen > 0 && dlen + 1 + flen + 1 <= sizeof buf) {
      std::memcpy(buf, p, dlen);
      buf[dlen] = '/';
      std::memcpy(buf + dlen + 1, file, flen + 1);
      ::execve(buf, argv, envp);
      if (errno == EACCES) result = EACCES;  // remember, keep searching (execvp(3) semantics)
      else if (errno != ENOENT && errno != ENOTDIR) return errno;
    }
    p = end ? end + 1 : nullptr;
  }
  return result;
}

}  // namespace

[[noreturn]] void child_tool_main(const ChildPlan& plan, int ready_fd) noexcept {
  int rep = plan.report_fd;  // moves to fd 3 below
  auto fail = [&rep](Stage s) { child_fail(rep, s, errno, 127); };

  // A session of its own: no controlling terminal of whoever started the
  // engine is reachable (TIOCSTI, job-control signals).
  if (::setsid() < 0) fail(Stage::Session);
  // If pid 1 dies, so does the tool (the pid namespace would kill it anyway).
  if (child_arm_death_signal() != 0) fail(Stage::DeathSignal);

  // Exactly the three pipes as 0-2; the report pipe (CLOEXEC: execve closes
  // it, and EOF on it tells the engine the exec happened) as 3 and `ready`
  // as 4; everything else the engine had open is closed here. The engine
  // keeps fds 0-2 of its own process open, so every pipe end here is >= 3
  // and the dup2s cannot clobber one another; the two kept descriptors are
  // first copied above 9 so that placing one cannot close the other.
  if (::dup2(plan.stdin_fd, 0) < 0 || ::dup2(plan.stdout_fd, 1) < 0 || ::dup2(plan.stderr_fd, 2) < 0)
    fail(Stage::Fds);
  int rep_high = ::fcntl(rep, F_DUPFD_CLOEXEC, 10);
  int ready_high = ::fcntl(ready_fd, F_DUPFD_CLOEXEC, 10);
  if (rep_high < 0 || ready_high < 0) fail(Stage::Fds);
  if (::dup3(rep_high, 3, O_CLOEXEC) < 0) fail(Stage::Fds);
  rep = 3;
  if (::dup3(ready_high, 4, O_CLOEXEC) < 0) fail(Stage::Fds);
  if (::close_range(5, ~0U, 0) != 0) fail(Stage::Fds);

  // Resource limits per process (file size, open files, CPU seconds, no core
  // dumps, process count for this run's uid). Lowering needs no privilege.
  for (std::size_t i = 0; i < plan.nrlimits; ++i) {
    struct rlimit rl {plan.rlimits[i].value, plan.rlimits[i].value};
    if (::setrlimit(plan.rlimits[i].resource, &rl) != 0) fail(Stage::Rlimits);
  }

  // Privileges, in the only order that works: securebits and the bounding
  // set need CAP_SETPCAP, the id switch needs CAP_SETUID/CAP_SETGID, so all
  // three come before the capability sets are emptied. NO_SETUID_FIXUP is
  // locked on, so the switch itself does not touch capabilities: the
  // explicit clear below is what empties them, and it is verified.
  if (child_lock_securebits() != 0) fail(Stage::Securebits);
  if (child_drop_bounding_set() != 0) fail(Stage::CapBound);
  // setgroups(2) is denied in this user namespace and the engine has no
  // supplementary groups, so gid and uid are all there is to switch.
  if (child::set_resgid(plan.tool_gid, plan.tool_gid, plan.tool_gid) != 0) fail(Stage::SetToolIds);
  if (child::set_resuid(plan.tool_uid, plan.tool_uid, plan.tool_uid) != 0) fail(Stage::SetToolIds);
  // The id switch cleared the death signal.
  if (child_arm_death_signal() != 0) fail(Stage::DeathSignal);
  if (child_clear_caps() != 0) fail(Stage::Caps);

  // No execve may ever grant privileges again (setuid bits, file caps); it
  // is also what lets an unprivileged process load a seccomp filter.
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) fail(Stage::NoNewPrivs);
  if (::prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) != 1) {
    errno = EPERM;
    fail(Stage::NoNewPrivs);
  }

  if (::chdir(plan.workdir) != 0) fail(Stage::Chdir);

  // Wait for toolsandbox-init: EOF once it runs with its own filter loaded.
  // A byte means the sandbox is being torn down: exit without a word (the
  // failure that caused it is reported already).
  for (;;) {
    char c;
    ssize_t n = ::read(4, &c, 1);
    if (n == 0) break;
    if (n > 0) ::_exit(127);
    if (errno != EINTR) fail(Stage::InitReady);
  }
  ::close(4);

  // Seccomp comes last: every step above may use syscalls the filter
  // refuses. The program was compiled once for the policy, in the engine.
  struct sock_fprog prog = plan.filter;
  if (prog.len == 0 || ::syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) != 0) {
    if (prog.len == 0) errno = EINVAL;
    fail(Stage::Seccomp);
  }

  errno = exec_tool(plan);
  fail(Stage::Execve);
  __builtin_unreachable();
}

}  // namespace tsb::isolate
