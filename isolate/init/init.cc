// toolsandbox-init: builds the sandbox from inside it, starts the tool and
// stays as its pid 1.
//
// The engine's clone3 child executes this program as soon as its id maps
// are written, so everything that happens inside the sandbox's namespaces
// runs in a fresh address space (no copy of the engine's memory: other
// runs' requests, keys) and outside the root process:
//
//   1. read the plan (isolate/engine/plan.h) the engine wrote for this run;
//   2. build the sandbox (build.cc) as the root of its user namespace;
//   3. fork the tool (tool.cc), which drops every privilege and waits;
//   4. drop every privilege of its own, load its own seccomp filter, and
//      let the tool go on;
//   5. do what a pid 1 must: reap orphans, report the tool's exit status,
//      and end the sandbox when the engine cannot. When init exits, the
//      kernel kills whatever else lives in the pid namespace
//      (pid_namespaces(7)); every way out below is an exit.
//
// It ends the run when:
//   - the tool exits (its status goes to the report pipe), or, with an end
//     note, the tool writes its status there (it is in its _exit);
//   - the engine is gone: the engine's end of the watch pipe closed (the
//     engine died, however it died), or the parent-death signal (SIGKILL)
//     arrived;
//   - its own wall-clock backstop expires: the engine enforces the run's
//     timeout itself; this is the fence for an engine that is alive but
//     stuck.
//
// Interface (set up by the engine; not meant to be run by hand):
//   argv[1]  the report pipe's descriptor (one Report per event, see stage.h)
//   argv[2]  the plan's descriptor (a memfd)
// As pid 1 it keeps uid 0 of the sandbox's user namespace (not the tool's
// uid, so the tool cannot signal or inspect it, and init cannot signal the
// tool either: it ends the sandbox by exiting), holds no capability, has
// no_new_privs and its own filter, and is not dumpable.
//
// Static, libc only.
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/securebits.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "isolate/init/init.h"

namespace tsb::isolate::init {

bool write_all(int fd, const void* buf, unsigned long len) noexcept {
  const char* p = static_cast<const char*>(buf);
  while (len > 0) {
    ssize_t n = ::write(fd, p, len);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += n;
    len -= static_cast<unsigned long>(n);
  }
  return true;
}

[[noreturn]] void fail_at(int report_fd, Stage stage, int err, int code, int step) noexcept {
  Report r{kReportMagic, Report::kSetupError, static_cast<int>(stage), err, step};
  (void)write_all(report_fd, &r, sizeof r);
  ::_exit(code);
}

int lock_securebits() noexcept {
  return ::prctl(PR_SET_SECUREBITS,
                 SECBIT_NOROOT | SECBIT_NOROOT_LOCKED | SECBIT_NO_SETUID_FIXUP | SECBIT_NO_SETUID_FIXUP_LOCKED |
                     SECBIT_KEEP_CAPS_LOCKED | SECBIT_NO_CAP_AMBIENT_RAISE | SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED,
                 0, 0, 0);
}

int drop_bounding_set() noexcept {
  for (int cap = 0; cap <= 63; ++cap) {
    if (::prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0) {
      if (errno == EINVAL) break;  // past the kernel's last capability
      return -1;
    }
  }
  return ::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
}

int clear_caps() noexcept {
  struct __user_cap_header_struct hdr {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct data[2] = {};
  if (::syscall(SYS_capset, &hdr, data) != 0) return -1;
  // Verify rather than trust: every set must read back empty.
  hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
  if (::syscall(SYS_capget, &hdr, data) != 0) return -1;
  for (auto& d : data) {
    if (d.effective || d.permitted || d.inheritable) {
      errno = EPERM;
      return -1;
    }
  }
  return 0;
}

int arm_death_signal() noexcept { return ::prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0); }

}  // namespace tsb::isolate::init

namespace {

using namespace tsb::isolate;
using namespace tsb::isolate::init;

// Where pid 1 keeps what it still needs once the tool runs.
constexpr int kReportFd = 3;
constexpr int kWatchFd = 4;
constexpr int kReadyFd = 5;
constexpr int kLeaseFd = 6;
constexpr int kEndFd = 7;  // a plan with an end note only

void report(int kind, int stage, int value) {
  Report r{kReportMagic, kind, stage, value};
  (void)write_all(kReportFd, &r, sizeof r);
}

// Set-up failed after the tool was forked: say why, tell the tool (blocked
// on `ready`) not to run, and end the sandbox.
[[noreturn]] void fail_after_fork(int report_fd, int ready_fd, Stage stage) {
  Report r{kReportMagic, Report::kSetupError, static_cast<int>(stage), errno};
  (void)write_all(report_fd, &r, sizeof r);
  (void)write_all(ready_fd, "X", 1);
  _exit(1);
}

bool parse_fd(const char* s, int* out) {
  long v = 0;
  if (*s == '\0') return false;
  for (; *s; ++s) {
    if (*s < '0' || *s > '9') return false;
    v = v * 10 + (*s - '0');
    if (v > (1 << 20)) return false;
  }
  *out = static_cast<int>(v);
  return true;
}

// The plan, mapped from its memfd; its strings stay in that mapping.
bool load_plan(int fd, Plan* plan) {
  struct stat st;
  if (fstat(fd, &st) != 0) return false;
  // Sealed by the engine: what is checked here is what is used.
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & (F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW)) {
    errno = EPERM;
    return false;
  }
  if (st.st_size <= 0 || static_cast<uint64_t>(st.st_size) > kMaxPlanBytes) {
    errno = E2BIG;
    return false;
  }
  void* m = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
  if (m == MAP_FAILED) return false;
  close(fd);
  if (!read_plan(static_cast<const char*>(m), static_cast<size_t>(st.st_size), plan)) {
    errno = EPROTO;
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  int report_fd = -1, plan_fd = -1;
  if (argc != 3 || !parse_fd(argv[1], &report_fd) || !parse_fd(argv[2], &plan_fd) || report_fd < 3 || plan_fd < 3 ||
      plan_fd == report_fd)
    _exit(1);

  // Not ptrace-attachable, and /proc/1/{mem,environ,fd} closed, even to its
  // own uid: the plan (the tool's environment) and, while building, every
  // capability of the namespace are here.
  if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) fail_at(report_fd, Stage::ExecInit, errno, 1);

  // Nothing of the engine's own stdio (0-2 are its, inherited): /dev/null.
  const int null = open("/dev/null", O_RDWR | O_CLOEXEC);
  for (int fd = 0; fd < 3; ++fd)
    if (null < 0 || dup2(null, fd) != fd) fail_at(report_fd, Stage::Fds, errno, 1);

  static Plan plan;
  if (!load_plan(plan_fd, &plan)) fail_at(report_fd, Stage::Plan, errno, 1);
  if (plan.report_fd != report_fd) fail_at(report_fd, Stage::Plan, EPROTO, 1);

  build_sandbox(plan);

  // Fork the tool. It drops its privileges while we do the same, then waits
  // on `ready` until this process runs with its filter loaded.
  //
  // The end note (plan.end_note): a pipe whose write end the tool keeps as
  // fd 3. One byte on it is the tool's exit status, which the runner (or a
  // script's launcher) writes after its output and just before its _exit:
  // the run ends then, not once the kernel has torn the process's memory
  // down (a millisecond and more for an interpreter). It lets the tool do nothing it could not already: exit
  // with any status it likes; pid 1's exit then ends every process left.
  int ready[2], end[2] = {-1, -1};
  if (pipe2(ready, O_CLOEXEC) != 0 || (plan.end_note && pipe2(end, O_CLOEXEC) != 0))
    fail_at(report_fd, Stage::Fork, errno, 1);
  const pid_t tool = fork();
  if (tool < 0) fail_at(report_fd, Stage::Fork, errno, 1);
  if (tool == 0) {
    close(ready[1]);
    if (end[0] >= 0) close(end[0]);
    tool_main(plan, ready[0], end[1]);
  }
  close(ready[0]);
  if (end[1] >= 0) close(end[1]);
  // From here a failure must stop the tool too: a byte on `ready` makes it
  // exit before it runs anything (EOF alone would let it go on). The report
  // goes first: a tool that has exited already makes the write to `ready`
  // fail (SIGPIPE), and the report must not be lost.

  // pid 1 keeps no end of the tool's pipes (EOF must mean the tool and its
  // descendants are done) and gets /dev/null as stdio. What it keeps goes
  // to fixed numbers (report 3, watch 4, ready 5, lease 6, the end note's
  // read end 7), each first copied above 9 so that no dup3 below clobbers
  // one not placed yet.
  int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (devnull < 0) fail_after_fork(report_fd, ready[1], Stage::Fds);
  for (int fd = 0; fd < 3; ++fd)
    if (dup2(devnull, fd) < 0) fail_after_fork(report_fd, ready[1], Stage::Fds);
  const int sources[] = {report_fd, plan.watch_fd, ready[1], plan.lease_fd, end[0]};
  const int kept = end[0] >= 0 ? 5 : 4;
  int high[5];
  for (int i = 0; i < kept; ++i)
    if ((high[i] = fcntl(sources[i], F_DUPFD_CLOEXEC, 10)) < 0) fail_after_fork(report_fd, ready[1], Stage::Fds);
  for (int i = 0; i < kept; ++i)
    if (dup3(high[i], kReportFd + i, 0) < 0) fail_after_fork(high[0], high[2], Stage::Fds);
  if (close_range(kReportFd + kept, ~0U, 0) != 0) fail_after_fork(kReportFd, kReadyFd, Stage::Fds);

  // pid 1 keeps uid 0 of the namespace (so the tool, another uid, can
  // neither signal nor inspect it) but holds no capability at all.
  if (lock_securebits() != 0) fail_after_fork(kReportFd, kReadyFd, Stage::Securebits);
  if (drop_bounding_set() != 0) fail_after_fork(kReportFd, kReadyFd, Stage::CapBound);
  if (clear_caps() != 0) fail_after_fork(kReportFd, kReadyFd, Stage::Caps);
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) fail_after_fork(kReportFd, kReadyFd, Stage::NoNewPrivs);

  // The signals this process acts on are blocked and read from a signalfd:
  // no handlers, no race between a signal and waitpid. Every other signal
  // keeps its default action; for pid 1 of a namespace that means only the
  // engine (root, outside) can deliver one, and it ends the sandbox.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGCHLD);
  sigaddset(&set, SIGALRM);
  if (sigprocmask(SIG_BLOCK, &set, nullptr) != 0) fail_after_fork(kReportFd, kReadyFd, Stage::ExecInit);
  int sfd = signalfd(-1, &set, SFD_CLOEXEC);
  if (sfd < 0) fail_after_fork(kReportFd, kReadyFd, Stage::ExecInit);
  if (plan.backstop_s > 0) alarm(plan.backstop_s);

  sock_fprog prog{plan.init_filter.len, plan.init_filter.insns};
  if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) != 0)
    fail_after_fork(kReportFd, kReadyFd, Stage::InitSeccomp);

  // Ready: the tool may run now.
  close(kReadyFd);

  bool end_open = plan.end_note;
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
    pollfd fds[3] = {{sfd, POLLIN, 0}, {kWatchFd, POLLIN, 0}, {end_open ? kEndFd : -1, POLLIN, 0}};
    int n = poll(fds, 3, -1);
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
    // The end note: its byte is the tool's exit status (the tool is in its
    // _exit). Closed without one (the tool's process ended without a
    // word, or gave fd 3 up): its own exit says how it ended.
    if (fds[2].revents != 0) {
      unsigned char status = 0;
      const ssize_t got = read(kEndFd, &status, 1);
      if (got == 1) {
        report(Report::kToolStatus, 0, status << 8);
        _exit(0);  // the kernel now kills the rest of the namespace
      }
      if (got == 0 || errno != EINTR) end_open = false;
    }
    if (fds[0].revents & POLLIN) {
      signalfd_siginfo si;
      ssize_t got = read(sfd, &si, sizeof si);
      if (got == static_cast<ssize_t>(sizeof si) && si.ssi_signo == SIGALRM) {
        report(Report::kBackstop, 0, static_cast<int>(plan.backstop_s));
        _exit(2);
      }
      // SIGCHLD: the loop reaps.
    }
  }
}
