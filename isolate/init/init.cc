// toolsandbox-init: pid 1 of every sandbox.
//
// The sandbox's first process becomes this program after building the
// sandbox, so pid 1 has a fresh address space (no copy of the engine's
// memory) and does only what a pid 1 must: reap orphans, report the tool's
// exit status to the engine, and end the sandbox when the engine cannot.
// When init exits, the kernel kills whatever else lives in the pid
// namespace (pid_namespaces(7)); every way out below is an exit.
//
// It ends the run when:
//   - the tool exits (its status goes to the report pipe);
//   - the engine is gone: the engine's end of the watch pipe closed (the
//     engine died, however it died), or the parent-death signal (SIGKILL,
//     armed again by the child path after its id switch) arrived;
//   - its own wall-clock backstop expires: the engine enforces the run's
//     timeout itself; this is the fence for an engine that is alive but
//     stuck.
//
// Interface (set up by child_sandbox.cc; not meant to be run by hand):
//   argv[1]  the tool's pid (in this pid namespace)
//   argv[2]  the backstop in seconds (0: none)
//   fd 3     the report pipe: one Report at the end
//   fd 4     a memfd holding init's own seccomp program (sock_filter array)
//   fd 6     the engine's watch pipe (read end)
//   fd 7     `ready` (write end): closed once this program runs with its
//            filter loaded, which lets the tool go on; a byte instead makes
//            the tool exit
//   fd 8     the run's uid-slot lease: held until init dies, so no other run
//            gets this run's host ids while it lives
// No capabilities, no_new_privs set, uid 0 of the sandbox's user namespace
// (not the tool's uid, so the tool cannot signal or inspect it, and init
// cannot signal the tool either: it ends the sandbox by exiting).
//
// Static, no allocation, libc only.
#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "isolate/stage.h"

using tsb::isolate::kReportMagic;
using tsb::isolate::Report;
using tsb::isolate::Stage;

namespace {

constexpr int kReportFd = 3;
constexpr int kFilterFd = 4;
constexpr int kWatchFd = 6;
constexpr int kReadyFd = 7;
constexpr unsigned kMaxInsns = BPF_MAXINSNS;
sock_filter g_filter[kMaxInsns];

void report(int kind, int stage, int value) {
  Report r{kReportMagic, kind, stage, value};
  const char* p = reinterpret_cast<const char*>(&r);
  size_t left = sizeof r;
  while (left > 0) {
    ssize_t n = write(kReportFd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    p += n;
    left -= static_cast<size_t>(n);
  }
}

// Set-up failed: say why, tell the tool (blocked on `ready`) not to run,
// and end the sandbox.
[[noreturn]] void fail(Stage stage, int err) {
  report(Report::kSetupError, static_cast<int>(stage), err);
  ssize_t n;
  do n = write(kReadyFd, "X", 1);
  while (n < 0 && errno == EINTR);
  _exit(1);
}

bool parse_number(const char* s, unsigned long max, unsigned long* out) {
  unsigned long v = 0;
  if (*s == '\0') return false;
  for (; *s; ++s) {
    if (*s < '0' || *s > '9') return false;
    v = v * 10 + static_cast<unsigned long>(*s - '0');
    if (v > max) return false;
  }
  *out = v;
  return true;
}

int load_filter() {
  size_t got = 0;
  char* buf = reinterpret_cast<char*>(g_filter);
  for (;;) {
    if (got == sizeof g_filter) {  // larger than BPF_MAXINSNS: refuse
      errno = E2BIG;
      return -1;
    }
    // pread: the memfd's open file description (and so its offset) is
    // shared by every sandbox started from the same engine.
    ssize_t n = pread(kFilterFd, buf + got, sizeof g_filter - got, static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -1;
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  close(kFilterFd);
  if (got == 0 || got % sizeof(sock_filter) != 0) {
    errno = EINVAL;
    return -1;
  }
  sock_fprog prog{static_cast<unsigned short>(got / sizeof(sock_filter)), g_filter};
  return static_cast<int>(syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog));
}

}  // namespace

int main(int argc, char** argv) {
  unsigned long tool_arg = 0, backstop = 0;
  if (argc != 3 || !parse_number(argv[1], 1ul << 22, &tool_arg) || tool_arg == 0 ||
      !parse_number(argv[2], 1ul << 24, &backstop))
    fail(Stage::ExecInit, EINVAL);
  const pid_t tool = static_cast<pid_t>(tool_arg);

  // Not ptrace-attachable, and /proc/1/{mem,environ,fd} closed, even to its
  // own uid. The tool runs as another uid already; this is the second fence,
  // and like every other step it fails closed.
  if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) fail(Stage::ExecInit, errno);

  // The signals this process acts on are blocked and read from a signalfd:
  // no handlers, no race between a signal and waitpid. Every other signal
  // keeps its default action; for pid 1 of a namespace that means only the
  // engine (root, outside) can deliver one, and it ends the sandbox.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGCHLD);
  sigaddset(&set, SIGALRM);
  if (sigprocmask(SIG_BLOCK, &set, nullptr) != 0) fail(Stage::ExecInit, errno);
  int sfd = signalfd(-1, &set, SFD_CLOEXEC);
  if (sfd < 0) fail(Stage::ExecInit, errno);
  if (backstop > 0) alarm(static_cast<unsigned>(backstop));

  if (load_filter() != 0) fail(Stage::InitSeccomp, errno);

  // Ready: the tool may run now.
  close(kReadyFd);

  for (;;) {
    // Reap everything that has exited: the tool, and orphans reparented to us.
    for (;;) {
      int status = 0;
      pid_t r = waitpid(-1, &status, WNOHANG);
      if (r == tool) {
        report(Report::kToolStatus, 0, status);
        _exit(0);  // the kernel now kills the rest of the namespace
      }
      if (r > 0) continue;
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 && errno == ECHILD) {
        // The tool is gone without us seeing its status: cannot happen while
        // it is our child; report what we know and end the sandbox.
        report(Report::kSetupError, static_cast<int>(Stage::ExecInit), ECHILD);
        _exit(1);
      }
      break;  // r == 0: children remain, none exited
    }
    pollfd fds[2] = {{sfd, POLLIN, 0}, {kWatchFd, POLLIN, 0}};
    int n = poll(fds, 2, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      _exit(3);
    }
    // The engine's end of the watch pipe closed (or, against the protocol,
    // something was written to it): the engine is gone. Nobody would
    // enforce this run's limits or read its result: end it.
    if (fds[1].revents != 0) {
      report(Report::kEngineGone, 0, 0);
      _exit(2);
    }
    if (fds[0].revents & POLLIN) {
      signalfd_siginfo si;
      ssize_t got = read(sfd, &si, sizeof si);
      if (got == static_cast<ssize_t>(sizeof si) && si.ssi_signo == SIGALRM) {
        report(Report::kBackstop, 0, static_cast<int>(backstop));
        _exit(2);
      }
      // SIGCHLD: the loop reaps.
    }
  }
}
