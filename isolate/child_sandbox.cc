// The clone3 child: pid 1 of the new pid namespace, root of the new user
// namespace, until it becomes toolsandbox-init.
//
// Runs between clone3 and execve, so: no allocation, no logging, no locks,
// no exceptions, async-signal-safe calls only. The plan is read-only here.
// Each step says which attack it closes; any failure is reported as
// (stage, errno) and ends the child: a sandbox is built completely or not at all.
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/mount.h>
#include <linux/securebits.h>
#include <net/if.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>

#include "isolate/child.h"
#include "isolate/child_common.h"

namespace tsb::isolate {

[[noreturn]] void child_fail(int report_fd, Stage stage, int err, int exit_code) noexcept {
  Report r{kReportMagic, Report::kSetupError, static_cast<int>(stage), err};
  (void)child::write_all(report_fd, &r, sizeof r);
  ::_exit(exit_code);
}

namespace {

#define FAIL_IF(cond, stage)                                        \
  do {                                                              \
    if (cond) child_fail(plan.report_fd, (stage), errno, 1);        \
  } while (0)

int setattr(const char* path, std::uint64_t set, bool recursive) noexcept {
  struct mount_attr attr {};
  attr.attr_set = set;
  return ::mount_setattr(AT_FDCWD, path, (recursive ? AT_RECURSIVE : 0) | AT_SYMLINK_NOFOLLOW, &attr,
                         sizeof attr);
}

int attach(int mount_fd, const char* dst) noexcept {
  return static_cast<int>(::syscall(SYS_move_mount, mount_fd, "", AT_FDCWD, dst, MOVE_MOUNT_F_EMPTY_PATH));
}

// Writes a short value to a /proc file.
int write_proc_value(const char* path, const char* value) noexcept {
  int fd = ::open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  bool ok = child::write_all(fd, value, std::strlen(value));
  int saved = errno;
  ::close(fd);
  errno = saved;
  return ok ? 0 : -1;
}

bool path_exists(const char* p) noexcept {
  struct stat st;
  return ::lstat(p, &st) == 0;
}

int make_target(const char* dst, bool dir) noexcept {
  if (dir) return (::mkdir(dst, 0755) == 0 || errno == EEXIST) ? 0 : -1;
  int fd = ::open(dst, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) return errno == EEXIST ? 0 : -1;
  ::close(fd);
  return 0;
}

// Returns 0 or -1 with errno set.
int run_step(const MountStep& s) noexcept {
  switch (s.kind) {
    case MountStep::kMkdir:
      if (::mkdir(s.dst, s.mode) != 0 && errno != EEXIST) return -1;
      return 0;
    case MountStep::kSymlink:
      return ::symlink(s.src, s.dst);
    case MountStep::kWriteFile: {
      int fd = ::open(s.dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, s.mode);
      if (fd < 0) return -1;
      bool ok = child::write_all(fd, s.data, s.len);
      int saved = errno;
      ::close(fd);
      errno = saved;
      return ok ? 0 : -1;
    }
    case MountStep::kBind:
      if (s.optional && !path_exists(s.src)) return 0;
      if (make_target(s.dst, s.is_dir) != 0) return -1;
      // MS_REC: submounts of the source come along (and get the same
      // attributes below), so nothing under a read-only bind stays writable.
      if (::mount(s.src, s.dst, nullptr, MS_BIND | MS_REC, nullptr) != 0) return -1;
      return setattr(s.dst, s.attr_set, true);
    case MountStep::kMount:
      if (make_target(s.dst, true) != 0) return -1;
      if (::mount(s.src, s.dst, s.fstype, s.flags, s.data) != 0) return -1;
      return s.attr_set ? setattr(s.dst, s.attr_set, true) : 0;
    case MountStep::kSetAttr:
      return setattr(s.dst, s.attr_set, true);
    case MountStep::kMaskFile:
      if (!path_exists(s.dst)) return 0;
      if (::mount(s.src, s.dst, nullptr, MS_BIND, nullptr) != 0) return -1;
      return setattr(s.dst, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC, false);
    case MountStep::kMaskDir:
      // An empty directory of the root tmpfs, not a tmpfs of its own: a
      // tmpfs mounted here would show this namespace's host uid in its
      // options in /proc/self/mountinfo.
      if (!path_exists(s.dst)) return 0;
      if (::mount(s.src, s.dst, nullptr, MS_BIND, nullptr) != 0) return -1;
      return setattr(s.dst, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC, false);
    case MountStep::kAttach:
      // A mount the parent made (a tmpfs, a read-only view of a host
      // directory) with its attributes set already: it only needs a place.
      // A host path the parent could not open (a missing venv) fails here,
      // with the parent's errno, so it is reported like any set-up step.
      if (s.fd < 0) {
        if (s.optional) return 0;
        errno = s.err != 0 ? s.err : EBADF;
        return -1;
      }
      if (make_target(s.dst, s.is_dir) != 0) return -1;
      return attach(s.fd, s.dst);
  }
  errno = EINVAL;
  return -1;
}

void wait_sync(const ChildPlan& plan, char expected) noexcept {
  char c = 0;
  ssize_t n;
  do n = ::read(plan.sync_fd, &c, 1);
  while (n < 0 && errno == EINTR);
  // EOF: the engine died or gave up on us. Anything else: protocol error.
  if (n != 1 || c != expected) child_fail(plan.report_fd, Stage::Sync, n == 0 ? EPIPE : (n < 0 ? errno : EPROTO), 1);
}

int loopback_up() noexcept {
  int s = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return -1;
  struct ifreq ifr {};
  std::memcpy(ifr.ifr_name, "lo", 3);
  int rc = ::ioctl(s, SIOCGIFFLAGS, &ifr);
  if (rc == 0) {
    ifr.ifr_flags |= IFF_UP;
    rc = ::ioctl(s, SIOCSIFFLAGS, &ifr);
  }
  int saved = errno;
  ::close(s);
  errno = saved;
  return rc;
}

}  // namespace

// Drops every privilege of the calling process except its uid: securebits
// locked so exec of a uid-0 program never grants capabilities again, the
// bounding and ambient sets emptied, then every capability set cleared.
// Shared with the tool path (child_tool.cc), which switches uid in between.
int child_lock_securebits() noexcept {
  return ::prctl(PR_SET_SECUREBITS,
                 SECBIT_NOROOT | SECBIT_NOROOT_LOCKED | SECBIT_NO_SETUID_FIXUP |
                     SECBIT_NO_SETUID_FIXUP_LOCKED | SECBIT_KEEP_CAPS_LOCKED |
                     SECBIT_NO_CAP_AMBIENT_RAISE | SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED,
                 0, 0, 0);
}

int child_drop_bounding_set() noexcept {
  for (int cap = 0; cap <= 63; ++cap) {
    if (::prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0) {
      if (errno == EINVAL) break;  // past the kernel's last capability
      return -1;
    }
  }
  return ::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
}

int child_clear_caps() noexcept {
  // The raw call, not libcap's cap_set_proc(): libcap may take a lock and
  // allocate on its way, and nothing here may.
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

int child_arm_death_signal() noexcept { return ::prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0); }

[[noreturn]] void child_sandbox_main(const ChildPlan& plan) noexcept {
  // Our copy of the sync pipe's write end goes first: with it, a read of
  // the sync pipe could never see EOF, and a child whose engine died before
  // its death signal was armed (or while the id switch had cleared it)
  // would wait there forever instead of ending.
  ::close(plan.sync_w_fd);
  // The engine blocked every signal around clone3 and had its handlers
  // cleared in the child (CLONE_CLEAR_SIGHAND), so no handler of its event
  // loop can run here. A session of our own, while signals are still
  // blocked: nothing sent to the engine's process group (a terminal's
  // Ctrl-C, a group kill) reaches the sandbox from now on. Then every
  // disposition goes back to the default (dropping what is pending) and the
  // mask is emptied.
  FAIL_IF(::setsid() < 0, Stage::Session);
  child::reset_signals();
  // If the engine dies while we set up, we die too: nobody would reap or
  // clean a half-built sandbox. The kernel clears this at every change of
  // the effective ids, so it is armed again after the switch in step 3.
  FAIL_IF(child_arm_death_signal() != 0, Stage::DeathSignal);

  // 1. While we still hold the engine's credentials (our user namespace has
  //    no mapping yet), where the kernel has the knob: no memfd of this pid
  //    namespace can ever be executed. A binary written to a memfd is the
  //    one way left to run code that is not on a read-only or noexec mount.
  if (plan.memfd_noexec) FAIL_IF(write_proc_value("/proc/sys/vm/memfd_noexec", "2") != 0, Stage::MemfdNoexec);

  // 2. Wait until the parent has written our uid/gid maps (setgroups is
  //    denied first, so no supplementary group can ever be dropped or added).
  wait_sync(plan, kSyncMaps);

  // 3. Become the mapped root of our user namespace (host uid = the run's
  //    range base). Until now we ran as an unmapped id and could not own
  //    files. The switch cleared the death signal: arm it again. Whether the
  //    engine died before that is what the next sync tells (EOF).
  FAIL_IF(child::set_resgid(0, 0, 0) != 0, Stage::SetIds);
  FAIL_IF(child::set_resuid(0, 0, 0) != 0, Stage::SetIds);
  FAIL_IF(child_arm_death_signal() != 0, Stage::DeathSignal);
  ::umask(022);

  // 4. No mount event may propagate back to the host's namespace.
  FAIL_IF(::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0, Stage::MountPrivate);

  // 5. A fresh tmpfs becomes the new root: nothing of the host is visible
  //    unless a step below puts it there explicitly. The parent made it, so
  //    its mount options carry no host uid, and gave its root directory to
  //    our uid 0.
  FAIL_IF(attach(plan.root_fd, plan.root) != 0, Stage::MountRoot);

  // 6. The file-system plan: skeleton, /etc stubs and copies, read-only views
  //    of the system directories and the venv, tmpfs /tmp and working dir,
  //    /proc with masks, a minimal /dev.
  for (std::size_t i = 0; i < plan.nsteps; ++i) {
    const MountStep& s = plan.steps[i];
    FAIL_IF(run_step(s) != 0, s.stage);
  }

  // 7. A private hostname (new uts namespace): the host's name does not leak.
  FAIL_IF(::sethostname(plan.hostname, std::strlen(plan.hostname)) != 0, Stage::Hostname);

  // 8. A new net namespace starts with lo down; bring it up so local
  //    sockets work. There is no other interface.
  if (plan.loopback_up) FAIL_IF(loopback_up() != 0, Stage::Loopback);

  // 9. Switch root and detach the old one, so no path (and no "..") leads
  //    back to the host's tree. pivot_root(".", ".") stacks the old root on
  //    the new one; the lazy unmount then removes it (pivot_root(2) NOTES).
  FAIL_IF(::chdir(plan.root) != 0, Stage::PivotRoot);
  FAIL_IF(::syscall(SYS_pivot_root, ".", ".") != 0, Stage::PivotRoot);
  FAIL_IF(::umount2(".", MNT_DETACH) != 0, Stage::PivotRoot);
  FAIL_IF(::chdir("/") != 0, Stage::PivotRoot);

  // 10. The root itself read-only: the skeleton and /etc files are final.
  FAIL_IF(setattr("/", MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, false) != 0,
          Stage::RemountRoot);

  // 11. Wait until we sit in the run's cgroup leaf (v1 migrates us; on v2
  //     clone3 placed us there). Limits apply before the tool exists.
  wait_sync(plan, kSyncCgroup);
  // Root the cgroup namespace at the leaf, so /proc/self/cgroup shows "/"
  // and nothing of the host's hierarchy. Done here rather than in clone3
  // because a cgroup namespace is rooted at the creator's cgroup, which is
  // the engine's, not the leaf.
  if (plan.unshare_cgroupns) FAIL_IF(::unshare(CLONE_NEWCGROUP) != 0, Stage::Cgroupns);

  // 12. Fork the tool. A raw clone (no glibc fork handlers, no locks). The
  //     tool drops its privileges while we do the same, then waits on
  //     `ready` until toolsandbox-init runs with its filter loaded: until
  //     then pid 1 is a copy of the engine, and no code of the tool may run
  //     beside it.
  int ready[2];
  FAIL_IF(::pipe2(ready, O_CLOEXEC) != 0, Stage::Fork);
  long pid = ::syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0);
  FAIL_IF(pid < 0, Stage::Fork);
  if (pid == 0) {
    ::close(ready[1]);
    child_tool_main(plan, ready[0]);
  }
  ::close(ready[0]);
  // From here a failure must stop the tool too: a byte on `ready` makes it
  // exit before it runs anything (EOF alone would let it go on). The report
  // goes first: a tool that has exited already makes the write to `ready`
  // fail (SIGPIPE, default by now), and the report must not be lost.
  // `ready_w` follows the write end to where step 13 places it.
  int ready_w = ready[1];
  auto fail = [&ready_w](int report, Stage st) {
    Report r{kReportMagic, Report::kSetupError, static_cast<int>(st), errno};
    (void)child::write_all(report, &r, sizeof r);
    (void)child::write_all(ready_w, "X", 1);
    ::_exit(1);
  };

  // 13. pid 1 keeps no end of the tool's pipes (EOF must mean the tool and
  //     its descendants are done) and gets /dev/null as stdio. Its other
  //     descriptors go to the numbers toolsandbox-init expects:
  //       3 report pipe, 4 init filter, 5 init executable (CLOEXEC),
  //       6 engine watch pipe, 7 `ready` (write end), 8 uid-slot lease.
  //     Each is first copied above 9, so that no dup3 below clobbers one
  //     that is not placed yet.
  int devnull = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  if (devnull < 0) fail(plan.report_fd, Stage::Fds);
  for (int fd = 0; fd < 3; ++fd)
    if (::dup2(devnull, fd) < 0) fail(plan.report_fd, Stage::Fds);
  const int sources[] = {plan.report_fd, plan.init_filter_fd, plan.init_exe_fd,
                         plan.watch_fd,  ready_w,             plan.lease_fd};
  constexpr int kPlaced = sizeof sources / sizeof sources[0];
  int high[kPlaced];
  for (int i = 0; i < kPlaced; ++i) {
    high[i] = ::fcntl(sources[i], F_DUPFD_CLOEXEC, 10);
    if (high[i] < 0) fail(plan.report_fd, Stage::Fds);
  }
  ready_w = high[4];  // the dup3s below may reuse its old number
  if (::dup3(high[0], 3, 0) < 0) fail(plan.report_fd, Stage::Fds);
  // From here on failures go to fd 3 (plan.report_fd is closed below), and
  // `ready` is fd 7 once placed.
  for (int i = 1; i < kPlaced; ++i) {
    if (::dup3(high[i], 3 + i, i == 2 ? O_CLOEXEC : 0) < 0) fail(3, Stage::Fds);
    if (i == 4) ready_w = 7;
  }
  if (::close_range(3 + kPlaced, ~0U, 0) != 0) fail(3, Stage::Fds);

  // 14. pid 1 keeps uid 0 of the namespace (so the tool, another uid, can
  //     neither signal nor inspect it) but holds no capability at all.
  if (child_lock_securebits() != 0) fail(3, Stage::Securebits);
  if (child_drop_bounding_set() != 0) fail(3, Stage::CapBound);
  if (child_clear_caps() != 0) fail(3, Stage::Caps);
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) fail(3, Stage::NoNewPrivs);

  // 15. Become toolsandbox-init: a small static reaper with a fresh address
  //     space, so no copy of the engine's memory (other runs' requests,
  //     keys) stays inside the sandbox. Its arguments: the tool's pid and
  //     its own wall-clock backstop in seconds. The death signal survives
  //     the exec (no set-id bit, no capability gained).
  char pid_arg[24], backstop_arg[24];
  child::format_unsigned(pid_arg, static_cast<unsigned long>(pid));
  child::format_unsigned(backstop_arg, plan.init_backstop_s);
  char name[] = "toolsandbox-init";
  char* const argv[] = {name, pid_arg, backstop_arg, nullptr};
  char* const envp[] = {nullptr};
  ::execveat(5, "", argv, envp, AT_EMPTY_PATH);
  fail(3, Stage::ExecInit);
  __builtin_unreachable();
}

}  // namespace tsb::isolate
