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
#include <netinet/in.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/random.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <dirent.h>

#include <climits>
#include <cstdio>
#include <cstring>

#include "isolate/init/init.h"

namespace tsb::isolate::init {
namespace {

#define FAIL_IF(cond, stage)                                    \
  do {                                                          \
    if (cond) fail_at(plan.report_fd, (stage), errno, 1);       \
  } while (0)

int sys_move_mount(int from, int to) noexcept {
  return static_cast<int>(
      ::syscall(SYS_move_mount, from, "", to, "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH));
}

int sys_setattr(int fd, std::uint64_t set, bool recursive) noexcept {
  struct mount_attr attr {};
  attr.attr_set = set;
  return static_cast<int>(
      ::syscall(SYS_mount_setattr, fd, "", AT_EMPTY_PATH | (recursive ? AT_RECURSIVE : 0), &attr, sizeof attr));
}

// `name` in `dir` as a directory, made (0755) when missing, opened without
// following a link. What stands in its place and is not a directory (a
// link, a FIFO, a socket, a file: what an earlier run of the policy can
// leave in a writable bind, which every later run shares) is removed and
// the directory made instead: it is never followed, and it does not fail
// the runs after it. Where init may not remove it (a read-only view), the
// step fails as before.
int open_dir_replacing(int dir, const char* name) noexcept {
  if (::mkdirat(dir, name, 0755) != 0 && errno != EEXIST) return -1;
  int fd = ::openat(dir, name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd >= 0 || (errno != ENOTDIR && errno != ELOOP)) return fd;
  if (::unlinkat(dir, name, 0) != 0 || ::mkdirat(dir, name, 0755) != 0) return -1;
  return ::openat(dir, name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
}

// The directory holding the last component of `path` (a sandbox path),
// reached from the new root one component at a time: each made or
// replaced as open_dir_replacing() says, "." and ".." refused. So no step
// reaches outside the new root, nor through a link a tool planted in a
// writable host directory that an earlier run saw. `*name` is the last
// component.
int open_parent(int root, const char* path, const char** name) noexcept {
  if (path[0] != '/') {
    errno = EINVAL;
    return -1;
  }
  int dir = ::fcntl(root, F_DUPFD_CLOEXEC, 0);
  for (const char* p = path + 1; dir >= 0;) {
    const char* slash = strchr(p, '/');
    const size_t len = slash ? static_cast<size_t>(slash - p) : strlen(p);
    char comp[NAME_MAX + 1];
    if (len == 0 || len > NAME_MAX || (p[0] == '.' && (len == 1 || (len == 2 && p[1] == '.')))) {
      ::close(dir);
      errno = EINVAL;
      return -1;
    }
    if (!slash) {
      *name = p;
      return dir;
    }
    memcpy(comp, p, len);
    comp[len] = '\0';
    const int next = open_dir_replacing(dir, comp);
    const int saved = errno;
    ::close(dir);
    errno = saved;
    dir = next;
    p = slash + 1;
  }
  return -1;
}

// Where a set-up step reports what it moved out of its way.
struct Where {
  int report_fd;
  int step;  // the plan's index of the step
  Stage stage;
};

// `name` in `dir`, which is not empty, renamed within `dir` to name +
// kAsideInfix + a random number, whole (nothing of it is removed or
// opened), and reported: the engine names it in the run's record.
int move_aside(int dir, const char* name, const Where& at) noexcept {
  unsigned v = 0;
  if (::getrandom(&v, sizeof v, 0) != static_cast<ssize_t>(sizeof v)) return -1;
  v &= 0x7fffffffu;
  char aside[NAME_MAX + 1];
  const int n = snprintf(aside, sizeof aside, "%s%s%u", name, kAsideInfix, v);
  if (n < 0 || n > NAME_MAX) {
    errno = ENAMETOOLONG;
    return -1;
  }
  if (::renameat2(dir, name, dir, aside, RENAME_NOREPLACE) != 0) return -1;
  Report r{kReportMagic, Report::kMovedAside, static_cast<int>(at.stage), static_cast<int>(v), at.step};
  return write_all(at.report_fd, &r, sizeof r) ? 0 : -1;
}

// `name` in `dir` as a directory or a regular file, made when missing; not
// a symlink, whatever is there. A mount point of the wrong kind that an
// earlier run left (a link, a FIFO, a socket or a device where a file is
// mounted; an empty directory there) is removed and made anew, as
// open_dir_replacing() does for directories; a directory with something
// in it, where a file is mounted, is moved aside (move_aside), so that
// nothing of it is lost and no later run fails on it.
int open_target(int dir, const char* name, bool is_dir, const Where& at) noexcept {
  if (is_dir) return open_dir_replacing(dir, name);
  struct stat there;
  if (::fstatat(dir, name, &there, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISREG(there.st_mode) &&
      ::unlinkat(dir, name, S_ISDIR(there.st_mode) ? AT_REMOVEDIR : 0) != 0 &&
      (!S_ISDIR(there.st_mode) || (errno != ENOTEMPTY && errno != EEXIST) || move_aside(dir, name, at) != 0))
    return -1;
  // Made when missing, never opened for writing when there: in a writable
  // bind it may be an earlier run's, of another uid slot, and a mount
  // point needs no access to its inode.
  int fd = ::openat(dir, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
  if (fd < 0 && errno != EEXIST) return -1;
  if (fd >= 0) ::close(fd);
  fd = ::openat(dir, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
  struct stat st;
  if (fd >= 0 && (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))) {
    ::close(fd);
    errno = ENOTDIR;
    return -1;
  }
  return fd;
}

int write_new_file(int dir, const char* name, const char* data, size_t len, unsigned mode) noexcept {
  Fd f{::openat(dir, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode)};
  if (f.fd < 0) return -1;
  return write_all(f.fd, data, len) ? 0 : -1;
}

// A new file holding what the host file `from` (opened by the engine)
// holds. In the kernel (sendfile) where `from`'s file system allows it,
// else read and written through a buffer. A file that grew past
// kMaxCopiedFileBytes since the engine measured it fails (EFBIG) instead
// of being cut short.
int copy_new_file(int dir, const char* name, int from, unsigned mode) noexcept {
  Fd f{::openat(dir, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode)};
  if (f.fd < 0) return -1;
  off_t off = 0;
  bool in_kernel = true;
  for (;;) {
    const size_t want = static_cast<size_t>(kMaxCopiedFileBytes + 1 - static_cast<std::uint64_t>(off));
    ssize_t n;
    if (in_kernel) {
      n = ::sendfile(f.fd, from, &off, want);
      if (n < 0 && off == 0 && (errno == EINVAL || errno == ENOSYS)) {
        in_kernel = false;
        continue;
      }
    } else {
      char buf[8192];
      n = ::pread(from, buf, want < sizeof buf ? want : sizeof buf, off);
      if (n > 0 && !write_all(f.fd, buf, static_cast<unsigned long>(n))) return -1;
      if (n > 0) off += n;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return n < 0 ? -1 : 0;
    if (static_cast<std::uint64_t>(off) > kMaxCopiedFileBytes) {
      errno = EFBIG;
      return -1;
    }
  }
}

// A version-4 UUID in the kernel's boot_id text form, at random, into `fd`.
int write_boot_id(int fd) noexcept {
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
  return write_all(fd, text, static_cast<unsigned long>(o)) ? 0 : -1;
}

// Whether the directory open as `fd` holds nothing but "." and "..".
bool dir_is_empty(int fd) noexcept {
  alignas(struct dirent64) char buf[512];
  const long n = ::syscall(SYS_getdents64, fd, buf, sizeof buf);
  int entries = 0;
  for (long off = 0; off < n; off += reinterpret_cast<struct dirent64*>(buf + off)->d_reclen) ++entries;
  return n > 0 && entries == 2;
}

// The object a mask binds over a /proc entry (kMask, kBootId), made here
// and now at `s.source`, a new name in the root tmpfs (O_EXCL: whatever
// stood there is never used): an empty directory (kStepDir) or an empty
// file (kBootId: holding a random boot id), of the step's mode. Bound from
// this descriptor, once checked to be that object: on the root tmpfs,
// ours, one link, not writable, empty. So no link, file with something in
// it, or object of another mount can be bound over /proc in a mask's name
// (the runc CVE-2025-31133 class). -1 and errno (EEXIST: something stood
// there; EPERM: the object is not the one made).
int make_mask(int root, const Step& s) noexcept {
  const char* name = nullptr;
  Fd dir{open_parent(root, s.source, &name)};
  if (dir.fd < 0) return -1;
  int fd = -1;
  if (s.dir) {
    if (::mkdirat(dir.fd, name, s.mode) == 0) fd = ::openat(dir.fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  } else {
    fd = ::openat(dir.fd, name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, s.mode);
    if (fd >= 0 && s.op == Op::kBootId && write_boot_id(fd) != 0) {
      ::close(fd);
      return -1;
    }
  }
  if (fd < 0) return -1;
  struct stat st, rt;
  const bool made = ::fstat(fd, &st) == 0 && ::fstat(root, &rt) == 0 && st.st_dev == rt.st_dev && st.st_uid == 0 &&
                    (st.st_mode & 0222) == 0 &&
                    (s.dir ? S_ISDIR(st.st_mode) && st.st_nlink == 2 && dir_is_empty(fd)
                           : S_ISREG(st.st_mode) && st.st_nlink == 1 && (s.op == Op::kBootId || st.st_size == 0));
  if (made) return fd;
  ::close(fd);
  errno = EPERM;
  return -1;
}

// A clone of the mount tree at `from`, read-only with `attrs`, moved onto
// `to` (itself, for kReadOnly). MOUNT_ATTR_* on the detached clone, so the
// mount never exists writable in the sandbox's tree.
int bind_read_only(int from, int to, bool recursive) noexcept {
  Fd tree{static_cast<int>(::syscall(SYS_open_tree, from, "",
                                     OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH | (recursive ? AT_RECURSIVE : 0)))};
  if (tree.fd < 0) return -1;
  constexpr std::uint64_t kAttrs = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC;
  if (sys_setattr(tree.fd, kAttrs, recursive) != 0) return -1;
  return sys_move_mount(tree.fd, to);
}

// A new proc for this pid namespace, nosuid, nodev, noexec, moved onto `to`.
int mount_proc(int to) noexcept {
  Fd fs{static_cast<int>(::syscall(SYS_fsopen, "proc", FSOPEN_CLOEXEC))};
  if (fs.fd < 0 || ::syscall(SYS_fsconfig, fs.fd, FSCONFIG_SET_STRING, "source", "proc", 0) != 0 ||
      ::syscall(SYS_fsconfig, fs.fd, FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) != 0)
    return -1;
  Fd m{static_cast<int>(::syscall(SYS_fsmount, fs.fd, FSMOUNT_CLOEXEC,
                                  MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC))};
  if (m.fd < 0) return -1;
  return sys_move_mount(m.fd, to);
}

// One step of the plan, under the new root `root`; 0 or -1 with errno set.
int run_step(int root, const Step& s, const Where& at) noexcept {
  const char* name = nullptr;
  Fd dir{open_parent(root, s.path, &name)};
  if (dir.fd < 0) return -1;
  switch (s.op) {
    case Op::kMkdir:
      return ::mkdirat(dir.fd, name, s.mode) == 0 || errno == EEXIST ? 0 : -1;
    case Op::kSymlink:
      return ::symlinkat(s.source, dir.fd, name);
    case Op::kWriteFile:
      return write_new_file(dir.fd, name, s.data, s.len, s.mode);
    case Op::kCopyFile: {
      Fd host{s.fd};  // the host file's descriptor is closed as soon as it is copied
      return copy_new_file(dir.fd, name, host.fd, s.mode);
    }
    case Op::kAttach: {
      // A mount the engine made (a tmpfs, a view of a host directory) with
      // its attributes set already: it only needs a place. A host path the
      // engine could not open (a missing venv) fails here, with the
      // engine's errno, so it is reported like any set-up step.
      if (s.fd < 0) {
        if (s.optional) return 0;
        errno = s.err != 0 ? s.err : EBADF;
        return -1;
      }
      // A host file shown by a bind must be a regular file: a FIFO, a
      // socket or a device put in its place would block or redirect the
      // tool's reads; the run is refused (ENXIO) instead.
      struct stat src;
      if (!s.dir && (::fstat(s.fd, &src) != 0 || !S_ISREG(src.st_mode))) {
        errno = ENXIO;
        return -1;
      }
      Fd to{open_target(dir.fd, name, s.dir, at)};
      return to.fd < 0 ? -1 : sys_move_mount(s.fd, to.fd);
    }
    case Op::kProc: {
      if (::mkdirat(dir.fd, name, s.mode) != 0 && errno != EEXIST) return -1;
      Fd to{::openat(dir.fd, name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)};
      return to.fd < 0 ? -1 : mount_proc(to.fd);
    }
    case Op::kDevice: {
      // Made by the engine in the /dev it attached; the tool's Landlock
      // rules let it read and write what stands here, so it must be the
      // character device the engine made.
      struct stat st;
      if (::fstatat(dir.fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return -1;
      if (!S_ISCHR(st.st_mode)) {
        errno = ENODEV;
        return -1;
      }
      return 0;
    }
    case Op::kMask:
    case Op::kBootId:
    case Op::kReadOnly: {
      // Only what exists is covered. A mask is an empty file or directory
      // of the root tmpfs, not a tmpfs of its own: a tmpfs mounted here
      // would show this namespace's host uid in its options in
      // /proc/self/mountinfo. A read-only path takes what is mounted below
      // it along (recursive), so nothing under it stays writable.
      Fd to{::openat(dir.fd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC)};
      if (to.fd < 0) return errno == ENOENT ? 0 : -1;
      if (s.op == Op::kReadOnly) return bind_read_only(to.fd, to.fd, true);
      Fd from{make_mask(root, s)};
      return from.fd < 0 ? -1 : bind_read_only(from.fd, to.fd, false);
    }
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

// The egress proxy's way in (network "egress"): a TCP listener on
// 127.0.0.1:kEgressProxyPort of this namespace, sent over the egress socket
// to the engine's front end, whose proxy accepts on it. Nothing here keeps
// it: the tool can connect to it, never accept on it. A front end already
// gone (the run is being killed) is EPIPE, without a SIGPIPE.
int hand_over_egress_listener(int channel) noexcept {
  int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return -1;
  struct sockaddr_in a {};
  a.sin_family = AF_INET;
  a.sin_port = htons(kEgressProxyPort);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int rc = ::bind(s, reinterpret_cast<struct sockaddr*>(&a), sizeof a);
  if (rc == 0) rc = ::listen(s, SOMAXCONN);
  if (rc == 0) {
    char byte = 'L';
    struct iovec iov {&byte, 1};
    alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    struct msghdr m {};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = control;
    m.msg_controllen = sizeof control;
    struct cmsghdr* c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &s, sizeof(int));
    ssize_t n;
    do n = ::sendmsg(channel, &m, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    rc = n == 1 ? 0 : -1;
  }
  int saved = errno;
  ::close(s);
  ::close(channel);
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
  Fd root{::open(plan.staging, O_PATH | O_DIRECTORY | O_CLOEXEC)};
  FAIL_IF(root.fd < 0 || sys_move_mount(plan.root_fd, root.fd) != 0, Stage::MountRoot);
  // The new root itself, now on top of the staging directory.
  Fd top{::open(plan.staging, O_PATH | O_DIRECTORY | O_CLOEXEC)};
  FAIL_IF(top.fd < 0, Stage::MountRoot);

  // 3. The file-system table's steps (daemon/policy/fs_table.h): skeleton, /etc
  //    stubs and copies, read-only views of the system directories and the
  //    venv, tmpfs /tmp and working dir, /proc with masks, a minimal /dev.
  //    A failure names its step, whose path the engine reports.
  for (uint32_t i = 0; i < plan.nsteps; ++i) {
    const Where at{plan.report_fd, static_cast<int>(i), plan.steps[i].stage};
    if (run_step(top.fd, plan.steps[i], at) != 0) fail_at(plan.report_fd, at.stage, errno, 1, at.step);
  }

  // 4. A private hostname (new uts namespace): the host's name does not leak.
  FAIL_IF(::sethostname(plan.hostname, strlen(plan.hostname)) != 0, Stage::Hostname);

  // 5. A new net namespace starts with lo down; bring it up so local
  //    sockets work. There is no other interface. With egress, the proxy's
  //    listener on it is the only way out.
  if (plan.network != kNetworkHost) FAIL_IF(loopback_up() != 0, Stage::Loopback);
  if (plan.network == kNetworkEgress) FAIL_IF(hand_over_egress_listener(plan.egress_fd) != 0, Stage::Egress);

  // 6. Switch root and detach the old one, so no path (and no "..") leads
  //    back to the host's tree. pivot_root(".", ".") stacks the old root on
  //    the new one; the lazy unmount then removes it (pivot_root(2) NOTES).
  FAIL_IF(::chdir(plan.staging) != 0, Stage::PivotRoot);
  FAIL_IF(::syscall(SYS_pivot_root, ".", ".") != 0, Stage::PivotRoot);
  FAIL_IF(::umount2(".", MNT_DETACH) != 0, Stage::PivotRoot);
  FAIL_IF(::chdir("/") != 0, Stage::PivotRoot);

  // 7. The root itself read-only: the skeleton and /etc files are final.
  {
    Fd slash{::open("/", O_PATH | O_DIRECTORY | O_CLOEXEC)};
    FAIL_IF(slash.fd < 0 || sys_setattr(slash.fd, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, false) != 0,
            Stage::RemountRoot);
  }

  // 8. The engine's word that we sit in the run's cgroup leaf (on v1 the
  //    clone3 child moved itself in before this image ran; on v2 clone3
  //    placed us there). Limits apply before the tool exists. Then root a
  //    cgroup namespace at the leaf, so /proc/self/cgroup shows "/" and
  //    nothing of the host's hierarchy (a cgroup namespace is rooted at its
  //    creator's cgroup: the leaf, by now, on v1 as on v2).
  wait_sync(plan, kSyncCgroup);
  FAIL_IF(::unshare(CLONE_NEWCGROUP) != 0, Stage::Cgroupns);
}

}  // namespace tsb::isolate::init
