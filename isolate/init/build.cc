// Building the sandbox, from inside its namespaces: toolsandbox-init runs
// as the root of the sandbox's user namespace (the run's host uid, every
// capability in that namespace and none outside it), executed by the
// engine's clone3 child right after its id maps were written. Each step
// says which attack it closes; any failure ends the run: a sandbox is built
// completely or not at all.
#include <errno.h>
#include <fcntl.h>
#include <linux/mount.h>
#include <net/if.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <cstring>

#include "isolate/init/init.h"

namespace tsb::isolate::init {
namespace {

#define FAIL_IF(cond, stage)                                    \
  do {                                                          \
    if (cond) fail_at(plan.report_fd, (stage), errno, 1);       \
  } while (0)

int setattr(const char* path, std::uint64_t set, bool recursive) noexcept {
  struct mount_attr attr {};
  attr.attr_set = set;
  return static_cast<int>(::syscall(SYS_mount_setattr, AT_FDCWD, path,
                                    (recursive ? AT_RECURSIVE : 0) | AT_SYMLINK_NOFOLLOW, &attr, sizeof attr));
}

int attach(int mount_fd, const char* dst) noexcept {
  return static_cast<int>(::syscall(SYS_move_mount, mount_fd, "", AT_FDCWD, dst, MOVE_MOUNT_F_EMPTY_PATH));
}

bool path_exists(const char* p) noexcept {
  struct stat st;
  return ::lstat(p, &st) == 0;
}

// `staging` + `path` into buf. The path must be a plain sandbox path: no
// "." or ".." component, no "//" (so no step reaches outside the new root
// before pivot_root).
int join(char* buf, const char* staging, const char* path) noexcept {
  for (const char* p = path; *p; ++p) {
    if (p[0] != '/') continue;
    if (p[1] == '/' || (p[1] == '.' && (p[2] == '/' || p[2] == '\0' || (p[2] == '.' && (p[3] == '/' || p[3] == '\0'))))) {
      errno = EINVAL;
      return -1;
    }
  }
  const size_t a = strlen(staging), b = strlen(path);
  if (path[0] != '/' || a + b + 1 > PATH_MAX) {
    errno = ENAMETOOLONG;
    return -1;
  }
  memcpy(buf, staging, a);
  memcpy(buf + a, path, b + 1);
  return 0;
}

// Every directory above `full` below the staging root, mode 0755.
int make_parents(char* full, size_t staging_len) noexcept {
  for (char* p = full + staging_len + 1; (p = strchr(p, '/')) != nullptr; ++p) {
    *p = '\0';
    const int rc = ::mkdir(full, 0755);
    const int saved = errno;
    *p = '/';
    if (rc != 0 && saved != EEXIST) {
      errno = saved;
      return -1;
    }
  }
  return 0;
}

int make_target(const char* dst, bool dir) noexcept {
  if (dir) return (::mkdir(dst, 0755) == 0 || errno == EEXIST) ? 0 : -1;
  int fd = ::open(dst, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) return errno == EEXIST ? 0 : -1;
  ::close(fd);
  return 0;
}

int write_new_file(const char* dst, const char* data, size_t len, unsigned mode) noexcept {
  int fd = ::open(dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
  if (fd < 0) return -1;
  bool ok = write_all(fd, data, len);
  int saved = errno;
  ::close(fd);
  errno = saved;
  return ok ? 0 : -1;
}

// A version-4 UUID in the kernel's boot_id text form, at random.
int write_boot_id(const char* dst, unsigned mode) noexcept {
  unsigned char r[16];
  if (::getrandom(r, sizeof r, 0) != static_cast<ssize_t>(sizeof r)) return -1;
  r[6] = static_cast<unsigned char>((r[6] & 0x0f) | 0x40);
  r[8] = static_cast<unsigned char>((r[8] & 0x3f) | 0x80);
  static constexpr char kHex[] = "0123456789abcdef";
  char text[37];
  int o = 0;
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) text[o++] = '-';
    text[o++] = kHex[r[i] >> 4];
    text[o++] = kHex[r[i] & 0xf];
  }
  text[o++] = '\n';
  return write_new_file(dst, text, static_cast<size_t>(o), mode);
}

constexpr std::uint64_t kMaskAttrs = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC;

// One step of the plan, paths already joined; 0 or -1 with errno set.
int run_step(const Step& s, const char* dst, const char* src) noexcept {
  switch (s.op) {
    case Op::kMkdir:
      if (::mkdir(dst, s.mode) != 0 && errno != EEXIST) return -1;
      return 0;
    case Op::kSymlink:
      return ::symlink(s.source, dst);
    case Op::kWriteFile:
      return write_new_file(dst, s.data, s.len, s.mode);
    case Op::kBootId:
      return write_boot_id(dst, s.mode);
    case Op::kAttach:
      // A mount the engine made (a tmpfs, a view of a host directory) with
      // its attributes set already: it only needs a place. A host path the
      // engine could not open (a missing venv) fails here, with the
      // engine's errno, so it is reported like any set-up step.
      if (s.fd < 0) {
        if (s.optional) return 0;
        errno = s.err != 0 ? s.err : EBADF;
        return -1;
      }
      if (make_target(dst, s.dir) != 0) return -1;
      return attach(s.fd, dst);
    case Op::kProc:
      if (::mkdir(dst, s.mode) != 0 && errno != EEXIST) return -1;
      return ::mount("proc", dst, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr);
    case Op::kMask:
      // An empty file or directory of the root tmpfs, not a tmpfs of its
      // own: a tmpfs mounted here would show this namespace's host uid in
      // its options in /proc/self/mountinfo.
      if (!path_exists(dst)) return 0;
      if (::mount(src, dst, nullptr, MS_BIND, nullptr) != 0) return -1;
      return setattr(dst, kMaskAttrs, false);
    case Op::kReadOnly:
      // MS_REC: what is mounted below comes along and gets the same
      // attributes, so nothing under a read-only path stays writable.
      if (!path_exists(dst)) return 0;
      if (::mount(dst, dst, nullptr, MS_BIND | MS_REC, nullptr) != 0) return -1;
      return setattr(dst, kMaskAttrs, true);
  }
  errno = EINVAL;
  return -1;
}

void wait_sync(const Plan& plan, char expected) noexcept {
  char c = 0;
  ssize_t n;
  do n = ::read(plan.sync_fd, &c, 1);
  while (n < 0 && errno == EINTR);
  // EOF: the engine died or gave up on us. Anything else: protocol error.
  if (n != 1 || c != expected) fail_at(plan.report_fd, Stage::Sync, n == 0 ? EPIPE : (n < 0 ? errno : EPROTO), 1);
}

int loopback_up() noexcept {
  int s = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return -1;
  struct ifreq ifr {};
  memcpy(ifr.ifr_name, "lo", 3);
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

void build_sandbox(const Plan& plan) noexcept {
  ::umask(022);

  // 1. No mount event may propagate back to the host's namespace.
  FAIL_IF(::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0, Stage::MountPrivate);

  // 2. A fresh tmpfs becomes the new root: nothing of the host is visible
  //    unless a step below puts it there explicitly. The engine made it, so
  //    its mount options carry no host uid, and gave its root directory to
  //    our uid 0.
  FAIL_IF(attach(plan.root_fd, plan.staging) != 0, Stage::MountRoot);

  // 3. The file-system table's steps (isolate/fs_table.h): skeleton, /etc
  //    stubs and copies, read-only views of the system directories and the
  //    venv, tmpfs /tmp and working dir, /proc with masks, a minimal /dev.
  const size_t staging_len = strlen(plan.staging);
  char dst[PATH_MAX], src[PATH_MAX];
  for (uint32_t i = 0; i < plan.nsteps; ++i) {
    const Step& s = plan.steps[i];
    FAIL_IF(join(dst, plan.staging, s.path) != 0 || make_parents(dst, staging_len) != 0, s.stage);
    if (s.op == Op::kMask) FAIL_IF(join(src, plan.staging, s.source) != 0, s.stage);
    FAIL_IF(run_step(s, dst, src) != 0, s.stage);
  }

  // 4. A private hostname (new uts namespace): the host's name does not leak.
  FAIL_IF(::sethostname(plan.hostname, strlen(plan.hostname)) != 0, Stage::Hostname);

  // 5. A new net namespace starts with lo down; bring it up so local
  //    sockets work. There is no other interface.
  if (plan.loopback_up) FAIL_IF(loopback_up() != 0, Stage::Loopback);

  // 6. Switch root and detach the old one, so no path (and no "..") leads
  //    back to the host's tree. pivot_root(".", ".") stacks the old root on
  //    the new one; the lazy unmount then removes it (pivot_root(2) NOTES).
  FAIL_IF(::chdir(plan.staging) != 0, Stage::PivotRoot);
  FAIL_IF(::syscall(SYS_pivot_root, ".", ".") != 0, Stage::PivotRoot);
  FAIL_IF(::umount2(".", MNT_DETACH) != 0, Stage::PivotRoot);
  FAIL_IF(::chdir("/") != 0, Stage::PivotRoot);

  // 7. The root itself read-only: the skeleton and /etc files are final.
  FAIL_IF(setattr("/", MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, false) != 0, Stage::RemountRoot);

  // 8. Wait until we sit in the run's cgroup leaf (v1 migrates us; on v2
  //    clone3 placed us there). Limits apply before the tool exists. Then
  //    root a cgroup namespace at the leaf, so /proc/self/cgroup shows "/"
  //    and nothing of the host's hierarchy (a cgroup namespace is rooted at
  //    its creator's cgroup, which is only now the leaf on v1).
  wait_sync(plan, kSyncCgroup);
  FAIL_IF(::unshare(CLONE_NEWCGROUP) != 0, Stage::Cgroupns);
}

}  // namespace tsb::isolate::init
