// The clone3 child: pid 1 of the new pid namespace, root of the new user
// namespace, until it becomes toolsandbox-init.
//
// Runs between clone3 and execve, so: no allocation, no logging, no locks,
// no exceptions, async-signal-safe calls only. The plan is read-only here.
// Each step says which attack it closes; any failure is reported as
// (stage, errno) and ends the child: a sandbox is built completely or not at all.
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/securebits.h>
#include <net/if.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
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
      if (!path_exists(s.dst)) return 0;
      return ::mount("tmpfs", s.dst, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                     "size=4k,nr_inodes=1,mode=0555");
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

int child_clear_caps(cap_t empty) noexcept {
  if (::cap_set_proc(empty) != 0) return -1;
  // Verify rather than trust: every set must read back empty.
  struct __user_cap_header_struct hdr {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct data[2] = {};
  if (::syscall(SYS_capget, &hdr, data) != 0) return -1;
  for (auto& d : data) {
    if (d.effective || d.permitted || d.inheritable) {
      errno = EPERM;
      return -1;
    }
  }
  return 0;
}

[[noreturn]] void child_sandbox_main(const ChildPlan& plan) noexcept {
  // The engine's signal handlers and mask must not survive into the sandbox.
  child::reset_signals();
  // If the engine dies while we set up, we die too (the parent never reaps
  // or cleans a half-built sandbox otherwise). Checked again at each sync.
  (void)::prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);

  // 1. Wait until the parent has written our uid/gid maps (setgroups is
  //    denied first, so no supplementary group can ever be dropped or added).
  wait_sync(plan, kSyncMaps);

  // 2. Become the mapped root of our user namespace (host uid = the run's
  //    range base). Until now we ran as an unmapped id and could not own files.
  FAIL_IF(::setresgid(0, 0, 0) != 0, Stage::SetIds);
  FAIL_IF(::setresuid(0, 0, 0) != 0, Stage::SetIds);
  ::umask(022);

  // 3. No mount event may propagate back to the host's namespace.
  FAIL_IF(::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0, Stage::MountPrivate);

  // 4. A fresh tmpfs becomes the new root: nothing of the host is visible
  //    unless a step below binds it in explicitly.
  FAIL_IF(::mount("toolsandbox", plan.root, "tmpfs", MS_NOSUID | MS_NODEV, plan.root_tmpfs_data) != 0,
          Stage::MountRoot);

  // 5. The file-system plan: skeleton, read-only system binds, the venv,
  //    /etc stubs, tmpfs /tmp and working dir, /proc with masks, minimal /dev.
  for (std::size_t i = 0; i < plan.nsteps; ++i) {
    const MountStep& s = plan.steps[i];
    FAIL_IF(run_step(s) != 0, s.stage);
  }

  // 6. A private hostname (new uts namespace): the host's name does not leak.
  FAIL_IF(::sethostname(plan.hostname, std::strlen(plan.hostname)) != 0, Stage::Hostname);

  // 7. A new net namespace starts with lo down; bring it up so local
  //    sockets work. There is no other interface.
  if (plan.loopback_up) FAIL_IF(loopback_up() != 0, Stage::Loopback);

  // 8. Switch root and detach the old one, so no path (and no "..") leads
  //    back to the host's tree. pivot_root(".", ".") stacks the old root on
  //    the new one; the lazy unmount then removes it (pivot_root(2) NOTES).
  FAIL_IF(::chdir(plan.root) != 0, Stage::PivotRoot);
  FAIL_IF(::syscall(SYS_pivot_root, ".", ".") != 0, Stage::PivotRoot);
  FAIL_IF(::umount2(".", MNT_DETACH) != 0, Stage::PivotRoot);
  FAIL_IF(::chdir("/") != 0, Stage::PivotRoot);

  // 9. The root itself read-only: the skeleton and /etc stubs are final.
  FAIL_IF(setattr("/", MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, false) != 0,
          Stage::RemountRoot);

  // 10. Wait until we sit in the run's cgroup leaf (v1 migrates us; on v2
  //     clone3 placed us there). Limits apply before the tool exists.
  wait_sync(plan, kSyncCgroup);
  // Root the cgroup namespace at the leaf, so /proc/self/cgroup shows "/"
  // and nothing of the host's hierarchy. Done here rather than in clone3
  // because a cgroup namespace is rooted at the creator's cgroup, which is
  // the engine's, not the leaf.
  if (plan.unshare_cgroupns) FAIL_IF(::unshare(CLONE_NEWCGROUP) != 0, Stage::Cgroupns);

  // 11. Fork the tool. A raw clone (no glibc fork handlers, no locks).
  long pid = ::syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0);
  FAIL_IF(pid < 0, Stage::Fork);
  if (pid == 0) child_tool_main(plan);

  // 12. pid 1 keeps no end of the tool's pipes (EOF must mean the tool and
  //     its descendants are done) and gets /dev/null as stdio.
  int devnull = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  FAIL_IF(devnull < 0, Stage::Fds);
  for (int fd = 0; fd < 3; ++fd) FAIL_IF(::dup2(devnull, fd) < 0, Stage::Fds);
  int rep = ::fcntl(plan.report_fd, F_DUPFD_CLOEXEC, 10);
  int flt = ::fcntl(plan.init_filter_fd, F_DUPFD_CLOEXEC, 10);
  int exe = ::fcntl(plan.init_exe_fd, F_DUPFD_CLOEXEC, 10);
  FAIL_IF(rep < 0 || flt < 0 || exe < 0, Stage::Fds);
  FAIL_IF(::dup3(rep, 3, 0) < 0, Stage::Fds);
  // From here on failures go to fd 3 (plan.report_fd is closed below).
  if (::dup3(flt, 4, 0) < 0 || ::dup3(exe, 5, O_CLOEXEC) < 0 || ::close_range(6, ~0U, 0) != 0)
    child_fail(3, Stage::Fds, errno, 1);

  // 13. pid 1 keeps uid 0 of the namespace (so the tool, another uid, can
  //     neither signal nor inspect it) but holds no capability at all.
  if (child_lock_securebits() != 0) child_fail(3, Stage::Securebits, errno, 1);
  if (child_drop_bounding_set() != 0) child_fail(3, Stage::CapBound, errno, 1);
  if (child_clear_caps(plan.empty_caps) != 0) child_fail(3, Stage::Caps, errno, 1);
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) child_fail(3, Stage::NoNewPrivs, errno, 1);

  // 14. Become toolsandbox-init: a small static reaper with a fresh address
  //     space, so no copy of the engine's memory (other runs' requests,
  //     keys) stays inside the sandbox. The tool's pid is its argument.
  char arg[16];
  {
    char digits[16];
    int n = 0;
    unsigned long v = static_cast<unsigned long>(pid);
    do digits[n++] = static_cast<char>('0' + v % 10);
    while ((v /= 10) != 0 && n < 15);
    for (int i = 0; i < n; ++i) arg[i] = digits[n - 1 - i];
    arg[n] = '\0';
  }
  char name[] = "toolsandbox-init";
  char* const argv[] = {name, arg, nullptr};
  char* const envp[] = {nullptr};
  ::execveat(5, "", argv, envp, AT_EMPTY_PATH);
  child_fail(3, Stage::ExecInit, errno, 1);
}

}  // namespace tsb::isolate
