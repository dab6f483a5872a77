// toolsandbox-init: pid 1 of every sandbox.
//
// The sandbox's first process becomes this program after building the
// sandbox, so pid 1 has a fresh address space (no copy of the engine's
// memory) and does only what a pid-1 must: reap orphans, forward termination
// requests to the tool, and report the tool's exit status to the engine.
// When the tool exits, init exits, and the kernel kills whatever the tool
// left behind in the pid namespace (pid_namespaces(7)).
//
// Interface (set up by child_sandbox.cc; not meant to be run by hand):
//   argv[1]  the tool's pid (in this pid namespace)
//   fd 3     the report pipe: one Report {kToolStatus, wait status} at the end
//   fd 4     a memfd holding init's own seccomp program (sock_filter array)
// No capabilities, no_new_privs set, uid 0 of the sandbox's user namespace
// (not the tool's uid, so the tool cannot signal or inspect it).
//
// Static, no allocation, libc only.
#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <sys/prctl.h>
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

[[noreturn]] void fail(pid_t tool, Stage stage, int err) {
  report(Report::kSetupError, static_cast<int>(stage), err);
  if (tool > 0) kill(tool, SIGKILL);
  _exit(1);
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
  pid_t tool = 0;
  if (argc == 2) {
    for (const char* p = argv[1]; *p; ++p) {
      if (*p < '0' || *p > '9' || tool > 100000000) {
        tool = 0;
        break;
      }
      tool = tool * 10 + (*p - '0');
    }
  }
  if (tool <= 0) fail(0, Stage::ExecInit, EINVAL);

  // Not ptrace-attachable, and /proc/1/{mem,environ,fd} closed, even to its
  // own uid. The tool runs as another uid already; this is the second fence,
  // and like every other step it fails closed.
  if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) fail(tool, Stage::ExecInit, errno);

  // Signals this process acts on are blocked and taken synchronously with
  // sigwaitinfo: no handlers, no races between a signal and waitpid.
  sigset_t set;
  sigemptyset(&set);
  static const int kSignals[] = {SIGCHLD, SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
  for (int s : kSignals) sigaddset(&set, s);
  if (sigprocmask(SIG_BLOCK, &set, nullptr) != 0) fail(tool, Stage::ExecInit, errno);

  if (load_filter() != 0) fail(tool, Stage::InitSeccomp, errno);

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
    siginfo_t si;
    int sig = sigwaitinfo(&set, &si);
    if (sig < 0 || sig == SIGCHLD) continue;
    // Termination requests go to the tool's process group (it called setsid).
    kill(-tool, sig);
    kill(tool, sig);
  }
}
