// The tool process: forked by the sandbox's pid 1 once the file system is
// final, it drops every privilege and executes the tool. Fails closed; the
// order matters and each step says why it sits where it does.
#include <errno.h>
#include <fcntl.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>

#include "isolate/init/init.h"
#include "isolate/init/landlock.h"

namespace tsb::isolate::init {
namespace {

// The PATH value the command is searched in when argv[0] has no '/': the
// tool's own PATH, else the default.
const char* path_search(const Plan& plan) noexcept {
  for (const char* const* e = plan.envp; *e; ++e)
    if (strncmp(*e, "PATH=", 5) == 0) return *e + 5;
  return "/venv/bin:/usr/local/bin:/usr/bin:/bin";
}

// execve(argv[0]) or, without a '/', each PATH entry in turn like execvp,
// but with the candidates built in a stack buffer.
int exec_tool(const Plan& plan) noexcept {
  const char* file = plan.argv[0];
  char* const* argv = const_cast<char* const*>(plan.argv);
  char* const* envp = const_cast<char* const*>(plan.envp);
  if (strchr(file, '/') != nullptr) {
    ::execve(file, argv, envp);
    return errno;
  }
  size_t flen = strlen(file);
  int result = ENOENT;
  const char* p = path_search(plan);
  char buf[4096];
  while (p != nullptr && *p != '\0') {
    const char* end = strchr(p, ':');
    size_t dlen = end ? static_cast<size_t>(end - p) : strlen(p);
    if (dlen > 0 && dlen + 1 + flen + 1 <= sizeof buf) {
      memcpy(buf, p, dlen);
      buf[dlen] = '/';
      memcpy(buf + dlen + 1, file, flen + 1);
      ::execve(buf, argv, envp);
      if (errno == EACCES) result = EACCES;  // remember, keep searching (execvp(3) semantics)
      else if (errno != ENOENT && errno != ENOTDIR) return errno;
    }
    p = end ? end + 1 : nullptr;
  }
  return result;
}

int set_rlimit(int resource, uint64_t value) noexcept {
  struct rlimit rl {static_cast<rlim_t>(value), static_cast<rlim_t>(value)};
  return ::setrlimit(resource, &rl);
}

}  // namespace

[[noreturn]] void tool_main(const Plan& plan, int ready_fd, int end_fd) noexcept {
  int rep = plan.report_fd;  // moves to fd 4 below
  auto fail = [&rep](Stage s) { fail_at(rep, s, errno, 127); };

  // A session of its own: no controlling terminal of whoever started the
  // engine is reachable (TIOCSTI, job-control signals).
  if (::setsid() < 0) fail(Stage::Session);
  // If pid 1 dies, so does the tool (the pid namespace would kill it anyway).
  if (arm_death_signal() != 0) fail(Stage::DeathSignal);

  // Exactly the three pipes as 0-2; the end note's pipe (a plan with one:
  // init.cc) as 3, the only other descriptor the tool keeps; the report
  // pipe (CLOEXEC: execve closes it, and EOF on it tells the engine the
  // exec happened) as 4 and `ready` as 5; everything else is closed here.
  // The kept descriptors are first copied above 9, so that placing one
  // cannot close another, and the pipes are copied there too before 0-2
  // are overwritten (the engine keeps its own 0-2 open, so they are above
  // 2, but a plan may name any).
  int io[3] = {::fcntl(plan.stdin_fd, F_DUPFD, 10), ::fcntl(plan.stdout_fd, F_DUPFD, 10),
               ::fcntl(plan.stderr_fd, F_DUPFD, 10)};
  int rep_high = ::fcntl(rep, F_DUPFD_CLOEXEC, 10);
  int ready_high = ::fcntl(ready_fd, F_DUPFD_CLOEXEC, 10);
  int end_high = end_fd < 0 ? -1 : ::fcntl(end_fd, F_DUPFD, 10);
  if (io[0] < 0 || io[1] < 0 || io[2] < 0 || rep_high < 0 || ready_high < 0 || (end_fd >= 0 && end_high < 0))
    fail(Stage::Fds);
  rep = rep_high;  // the old number may be overwritten below
  for (int fd = 0; fd < 3; ++fd)
    if (::dup2(io[fd], fd) < 0) fail(Stage::Fds);
  if (end_high < 0) ::close(3);                            // nothing there after the execve
  else if (::dup2(end_high, 3) < 0) fail(Stage::Fds);  // dup2: not close-on-exec
  if (::dup3(rep_high, 4, O_CLOEXEC) < 0) fail(Stage::Fds);
  rep = 4;
  if (::dup3(ready_high, 5, O_CLOEXEC) < 0) fail(Stage::Fds);
  if (::close_range(6, ~0U, 0) != 0) fail(Stage::Fds);

  // Resource limits per process (the cgroup holds the run-wide ones): no
  // core dumps, file size, open files; RLIMIT_NPROC counts exactly this
  // run's processes (its host uids are its own), a second fence behind
  // pids.max; RLIMIT_CPU a backstop (the engine measures the whole cgroup);
  // RLIMIT_NICE and RLIMIT_RTPRIO 0, whatever the daemon was given: no
  // process of the run can raise its priority above the one it starts
  // with, nor take a real-time policy (the default seccomp profile allows
  // sched_setscheduler, as the kernel then refuses both).
  // Lowering needs no privilege.
  if (set_rlimit(RLIMIT_CORE, 0) != 0 || set_rlimit(RLIMIT_NICE, 0) != 0 || set_rlimit(RLIMIT_RTPRIO, 0) != 0 ||
      set_rlimit(RLIMIT_FSIZE, plan.file_size) != 0 ||
      set_rlimit(RLIMIT_NOFILE, plan.open_files) != 0 || set_rlimit(RLIMIT_NPROC, plan.pids) != 0 ||
      (plan.cpu_time_ms > 0 && set_rlimit(RLIMIT_CPU, (plan.cpu_time_ms + 999) / 1000 + 1) != 0))
    fail(Stage::Rlimits);

  // Privileges, in the only order that works: securebits and the bounding
  // set need CAP_SETPCAP, the id switch needs CAP_SETUID/CAP_SETGID, so all
  // three come before the capability sets are emptied. NO_SETUID_FIXUP is
  // locked on, so the switch itself does not touch capabilities: the
  // explicit clear below is what empties them, and it is verified.
  if (lock_securebits() != 0) fail(Stage::Securebits);
  if (drop_bounding_set() != 0) fail(Stage::CapBound);
  // setgroups(2) is denied in this user namespace and the engine has no
  // supplementary groups, so gid and uid are all there is to switch.
  if (::syscall(SYS_setresgid, plan.tool_gid, plan.tool_gid, plan.tool_gid) != 0) fail(Stage::SetToolIds);
  if (::syscall(SYS_setresuid, plan.tool_uid, plan.tool_uid, plan.tool_uid) != 0) fail(Stage::SetToolIds);
  // The id switch cleared the death signal.
  if (arm_death_signal() != 0) fail(Stage::DeathSignal);
  if (clear_caps() != 0) fail(Stage::Caps);

  // No execve may ever grant privileges again (setuid bits, file caps); it
  // is also what lets an unprivileged process load a seccomp filter.
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) fail(Stage::NoNewPrivs);
  if (::prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) != 1) {
    errno = EPERM;
    fail(Stage::NoNewPrivs);
  }

  if (::chdir(plan.workdir) != 0) fail(Stage::Chdir);

  // Landlock: a second wall behind the mounts, made from the plan's steps
  // (isolate/init/landlock.h). After no_new_privs, which it needs, and
  // before the filter, which refuses its system calls. A kernel without it
  // runs as before; any other failure ends the run. What was applied goes
  // to the run's record.
  {
    const int root = ::open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
    const int applied = root < 0 ? -1 : apply_landlock(plan, root);
    if (applied < 0) fail(Stage::Landlock);
    ::close(root);
    Report r{kReportMagic, Report::kLandlock, 0, applied};
    if (!write_all(rep, &r, sizeof r)) fail(Stage::Landlock);
  }

  // Wait for pid 1: EOF once it runs with its own filter loaded. A byte
  // means the sandbox is being torn down: exit without a word (the failure
  // that caused it is reported already).
  for (;;) {
    char c;
    ssize_t n = ::read(5, &c, 1);
    if (n == 0) break;
    if (n > 0) ::_exit(127);
    if (errno != EINTR) fail(Stage::InitReady);
  }
  ::close(5);

  // Seccomp comes last: every step above may use syscalls the filter
  // refuses. The program was compiled once for the policy, by the engine's
  // caller; the plan carries it.
  struct sock_fprog prog {plan.tool_filter.len, plan.tool_filter.insns};
  if (::syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) != 0) fail(Stage::Seccomp);

  errno = exec_tool(plan);
  fail(Stage::Execve);
  __builtin_unreachable();
}

}  // namespace tsb::isolate::init
