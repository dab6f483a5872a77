#include "isolate/engine/child.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <linux/openat2.h>
#include <signal.h>
#include <sys/statfs.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "isolate/engine/plan.h"
#include "isolate/engine/stage.h"

namespace tsb::isolate {
namespace {

[[noreturn]] void fail(const ChildStart& c, Stage stage) noexcept {
  Report r{kReportMagic, Report::kSetupError, static_cast<int>(stage), errno};
  const char* p = reinterpret_cast<const char*>(&r);
  for (std::size_t left = sizeof r; left > 0;) {
    ssize_t n = ::write(c.report_fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  ::_exit(1);
}

}  // namespace

int open_proc_file(int proc, const char* path) noexcept {
  struct open_how how {};
  how.flags = O_WRONLY | O_CLOEXEC;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV;
  const int fd = static_cast<int>(::syscall(SYS_openat2, proc, path, &how, sizeof how));
  struct statfs fs;
  if (fd < 0 || (::fstatfs(fd, &fs) == 0 && fs.f_type == PROC_SUPER_MAGIC)) return fd;
  ::close(fd);
  errno = EXDEV;
  return -1;
}

[[noreturn]] void child_main(const ChildStart& c) noexcept {
  // Our copy of the sync pipe's write end goes first: with it, a read of
  // the sync pipe could never see EOF, and a child whose engine died before
  // its death signal was armed (or while the id switch had cleared it)
  // would wait there forever instead of ending.
  ::close(c.sync_w_fd);
  // The engine blocked every signal around clone3 and had its handlers
  // cleared in the child (CLONE_CLEAR_SIGHAND), so no handler of its loop
  // can run here. A session of our own, while signals are still blocked:
  // nothing sent to the engine's process group (a terminal's Ctrl-C, a
  // group kill) reaches the sandbox from now on. Then every disposition
  // goes back to the default, each first set to "ignore", which discards
  // any instance already pending, and the mask is emptied.
  if (::setsid() < 0) fail(c, Stage::Session);
  struct sigaction ign {}, dfl {};
  ign.sa_handler = SIG_IGN;
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig == SIGKILL || sig == SIGSTOP) continue;
    (void)::sigaction(sig, &ign, nullptr);  // EINVAL for glibc-reserved signals: harmless
    (void)::sigaction(sig, &dfl, nullptr);
  }
  sigset_t none;
  sigemptyset(&none);
  (void)::sigprocmask(SIG_SETMASK, &none, nullptr);
  // If the engine dies while the sandbox is set up, it dies too: nobody
  // would reap or clean a half-built sandbox. The kernel clears this at
  // every change of the effective ids: armed again after the switch.
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0) fail(c, Stage::DeathSignal);

  // While we still hold the engine's credentials (the user namespace has
  // no mapping yet), where the kernel has the knob: no memfd of this pid
  // namespace can ever be executed. A binary written to a memfd is the one
  // way left to run code that is not on a read-only or noexec mount.
  if (c.memfd_noexec) {
    int fd = open_proc_file(c.proc_fd, "sys/vm/memfd_noexec");
    if (fd < 0 || ::write(fd, "2", 1) != 1) fail(c, Stage::MemfdNoexec);
    ::close(fd);
  }

  // v1: into the run's leaf, each hierarchy's, by writing "0" (this task
  // only) to its `tasks` file, opened by the engine: the kernel checks the
  // opener's credentials, and a task moving only itself takes no global
  // lock (cgroup.h, join_fds). Before anything of the run is charged; the
  // descriptors close at the execve, so nothing of the sandbox ever holds
  // one. On v2 clone3 placed us (CLONE_INTO_CGROUP) and there are none.
  // (No handler is set: no EINTR.)
  for (std::size_t i = 0; i < c.njoin; ++i)
    if (::write(c.join[i].get(), "0", 1) != 1) fail(c, Stage::CgroupJoin);

  // Wait until the parent has written our uid/gid maps (setgroups is
  // denied first, so no supplementary group can ever be dropped or added).
  char sync = 0;
  ssize_t n;
  do n = ::read(c.sync_fd, &sync, 1);
  while (n < 0 && errno == EINTR);
  if (n != 1 || sync != kSyncMaps) {
    errno = n == 0 ? EPIPE : (n < 0 ? errno : EPROTO);  // EOF: the engine died or gave up on us
    fail(c, Stage::Sync);
  }

  // Become the mapped root of the user namespace (host uid = the run's
  // range base), with raw system calls: glibc's setresuid signals every
  // thread glibc knows of, and its list is the engine's. Until now we ran
  // as an unmapped id. The death signal again; whether the engine died
  // before is what init's next sync tells (EOF).
  if (::syscall(SYS_setresgid, 0, 0, 0) != 0 || ::syscall(SYS_setresuid, 0, 0, 0) != 0) fail(c, Stage::SetIds);
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0) fail(c, Stage::DeathSignal);

  // The descriptors the plan names, across the execve (the engine makes
  // every descriptor close-on-exec; the others close there).
  for (std::size_t i = 0; i < c.nkeep; ++i)
    if (::fcntl(c.keep[i], F_SETFD, 0) != 0) fail(c, Stage::Fds);

  // toolsandbox-init, as the namespace's root (every capability inside it,
  // none outside): a fresh address space builds the sandbox. The death
  // signal survives the exec (no set-id bit, no capability gained).
  char name[] = "toolsandbox-init";
  char* const argv[] = {name, const_cast<char*>(c.report_arg), const_cast<char*>(c.plan_arg), nullptr};
  char* const envp[] = {nullptr};
  ::syscall(SYS_execveat, c.init_fd, "", argv, envp, AT_EMPTY_PATH);
  fail(c, Stage::ExecInit);
}

}  // namespace tsb::isolate
