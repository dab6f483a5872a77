#include "isolate/mounts.h"

#include <fcntl.h>
#include <linux/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cstring>

namespace tsb::isolate {
namespace {

// glibc 2.36 wraps none of the new mount API.
int sys_fsopen(const char* fs, unsigned flags) { return static_cast<int>(::syscall(SYS_fsopen, fs, flags)); }
int sys_fsconfig(int fd, unsigned cmd, const char* key, const char* value) {
  return static_cast<int>(::syscall(SYS_fsconfig, fd, cmd, key, value, 0));
}
int sys_fsmount(int fd, unsigned attrs) { return static_cast<int>(::syscall(SYS_fsmount, fd, FSMOUNT_CLOEXEC, attrs)); }
int sys_open_tree(const char* path, unsigned flags) {
  return static_cast<int>(::syscall(SYS_open_tree, AT_FDCWD, path, flags));
}
int sys_mount_setattr(int fd, std::uint64_t set, bool recursive, std::uint64_t propagation = 0) {
  struct mount_attr attr {};
  attr.attr_set = set;
  attr.propagation = propagation;
  return static_cast<int>(::syscall(SYS_mount_setattr, fd, "", AT_EMPTY_PATH | (recursive ? AT_RECURSIVE : 0), &attr,
                                    sizeof attr));
}

// The message the kernel left in a file system context, if any ("e overlayfs: ...").
std::string context_log(int fsfd) {
  std::string out;
  char buf[512];
  for (int i = 0; i < 4; ++i) {
    ssize_t n = ::read(fsfd, buf, sizeof buf - 1);
    if (n <= 0) break;
    buf[n] = '\0';
    if (!out.empty()) out += "; ";
    out += n > 2 && buf[1] == ' ' ? buf + 2 : buf;
  }
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

Error fs_error(const char* what, const std::string& subject, int fsfd) {
  int err = errno;
  std::string log = fsfd >= 0 ? context_log(fsfd) : std::string();
  Error e = Error::from_errno(err, std::string(what) + " " + subject);
  if (!log.empty()) e.message += " (" + log + ")";
  return e;
}

// A new superblock of `type` with `options` ("k=v,k=v"), as a detached
// mount with `attrs`. The source name is the one word mountinfo shows.
Result<UniqueFd> make_fs(const char* type, const std::string& options, std::uint64_t attrs) {
  UniqueFd fs(sys_fsopen(type, FSOPEN_CLOEXEC));
  if (!fs) return Error::from_errno(std::string("fsopen ") + type);
  if (sys_fsconfig(fs.get(), FSCONFIG_SET_STRING, "source", "toolsandbox") != 0)
    return fs_error("fsconfig source of", type, fs.get());
  std::size_t pos = 0;
  while (pos < options.size()) {
    std::size_t end = options.find(',', pos);
    if (end == std::string::npos) end = options.size();
    std::string kv = options.substr(pos, end - pos);
    pos = end + 1;
    if (kv.empty()) continue;
    auto eq = kv.find('=');
    std::string key = kv.substr(0, eq);
    int rc = eq == std::string::npos ? sys_fsconfig(fs.get(), FSCONFIG_SET_FLAG, key.c_str(), nullptr)
                                     : sys_fsconfig(fs.get(), FSCONFIG_SET_STRING, key.c_str(), kv.c_str() + eq + 1);
    if (rc != 0) return fs_error("fsconfig", std::string(type) + " " + kv, fs.get());
  }
  if (sys_fsconfig(fs.get(), FSCONFIG_CMD_CREATE, nullptr, nullptr) != 0) return fs_error("creating", type, fs.get());
  UniqueFd m(sys_fsmount(fs.get(), static_cast<unsigned>(attrs)));
  if (!m) return fs_error("fsmount", type, fs.get());
  return m;
}

// A tmpfs whose root directory belongs to sandbox ids uid:gid. Owned by
// the engine when made, so its options carry no uid=/gid=; chowned after.
Result<UniqueFd> make_tmpfs(const MountRequest& r, const MountContext& ctx) {
  // Read-only comes last: the parent may still fill it (kDev).
  auto m = make_fs("tmpfs", r.options, r.attrs & ~static_cast<std::uint64_t>(MOUNT_ATTR_RDONLY));
  if (!m.ok()) return std::move(m).error();
  if (::fchownat(m->get(), "", ctx.host_id_base + r.uid, ctx.host_id_base + r.gid, AT_EMPTY_PATH) != 0)
    return Error::from_errno("chown tmpfs root");
  return m;
}

// The contents of /dev: device nodes like the host's (the parent may mknod,
// the sandbox may not), the /proc/self/fd links, and shm/ for /dev/shm.
// Modes are set explicitly: the engine's umask (0077 under systemd) must
// not decide who may open /dev/null.
Status fill_dev(int dev) {
  for (const char* name : device_names()) {
    struct stat st{};
    std::string host = std::string("/dev/") + name;
    if (::stat(host.c_str(), &st) != 0) return Error::from_errno("stat '" + host + "'");
    if (!S_ISCHR(st.st_mode)) return Error::invalid("'" + host + "' is not a character device", ENODEV);
    if (::mknodat(dev, name, S_IFCHR | 0666, st.st_rdev) != 0) return Error::from_errno(std::string("mknod /dev/") + name);
    if (::fchmodat(dev, name, 0666, 0) != 0) return Error::from_errno(std::string("chmod /dev/") + name);
  }
  static constexpr const char* kLinks[][2] = {
      {"/proc/self/fd", "fd"}, {"/proc/self/fd/0", "stdin"}, {"/proc/self/fd/1", "stdout"}, {"/proc/self/fd/2", "stderr"}};
  for (const auto& l : kLinks)
    if (::symlinkat(l[0], dev, l[1]) != 0) return Error::from_errno(std::string("symlink /dev/") + l[1]);
  if (::mkdirat(dev, "shm", 0755) != 0 || ::fchmodat(dev, "shm", 0755, 0) != 0) return Error::from_errno("mkdir /dev/shm");
  return {};
}

// What a host path becomes. Read-only directories: an overlay with the
// host directory as its only content (the empty directory below it makes
// a read-only overlay valid on kernels that want two lower layers). The
// rest (a writable bind, a file too large to copy, overlays turned off):
// a clone of the host's mount tree at that path.
// Errors opening the host path are returned as a bare errno (`*deferred`),
// for the child to report at its step.
Result<UniqueFd> make_view(const MountRequest& r, const MountContext& ctx, int* deferred) {
  *deferred = 0;
  if (r.is_dir && !r.writable && ctx.overlay_views) {
    UniqueFd dir(::open(r.host_path.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!dir) {
      *deferred = errno;
      return UniqueFd();
    }
    std::string lower = "lowerdir=/proc/self/fd/" + std::to_string(dir.get()) + ":/proc/self/fd/" +
                        std::to_string(ctx.empty_dir_fd);
    auto m = make_fs("overlay", lower, r.attrs);
    if (!m.ok()) return std::move(m).error().wrap("read-only view of '" + r.host_path + "'");
    return m;
  }
  UniqueFd t(sys_open_tree(r.host_path.c_str(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE));
  if (!t) {
    *deferred = errno;
    return UniqueFd();
  }
  // The clone is in the peer group of the host's mount at that path (when
  // that one is shared): made private, so that nothing mounted on or below
  // it inside the sandbox (a nested bind) propagates back to the host, and
  // no host mount event reaches the sandbox. The child's MS_REC|MS_PRIVATE
  // on its tree does not reach mounts attached after it.
  if (sys_mount_setattr(t.get(), r.attrs, true, MS_PRIVATE) != 0)
    return Error::from_errno("mount_setattr on the bind of '" + r.host_path + "'");
  return t;
}

}  // namespace

Result<PreparedMounts> prepare_mounts(PlanStorage& st, ChildPlan& plan, const MountContext& ctx) {
  PreparedMounts out;
  auto root = make_tmpfs(st.root, ctx);
  if (!root.ok()) return std::move(root).error().wrap("the root tmpfs");
  out.root = std::move(root).value();
  plan.root_fd = out.root.get();
  out.fds.reserve(st.mounts.size());
  for (const MountRequest& r : st.mounts) {
    MountStep& step = st.steps.at(r.step);
    const char* where = step.dst;
    UniqueFd fd;
    if (r.kind == MountRequest::kView) {
      int deferred = 0;
      auto v = make_view(r, ctx, &deferred);
      if (!v.ok()) return std::move(v).error();
      fd = std::move(v).value();
      step.err = deferred;
    } else {
      auto t = make_tmpfs(r, ctx);
      if (!t.ok()) return std::move(t).error().wrap(std::string("tmpfs for ") + where);
      fd = std::move(t).value();
      if (r.kind == MountRequest::kDev) TSB_TRY(fill_dev(fd.get()), "populating /dev");
      if (r.attrs & MOUNT_ATTR_RDONLY) {
        if (sys_mount_setattr(fd.get(), MOUNT_ATTR_RDONLY, false) != 0)
          return Error::from_errno(std::string("making ") + where + " read-only");
      }
    }
    step.fd = fd.get();
    out.fds.push_back(std::move(fd));
  }
  return out;
}

Status probe_overlay_views(int empty_dir_fd) {
  MountRequest r{};
  r.kind = MountRequest::kView;
  r.host_path = "/usr";
  r.is_dir = true;
  r.attrs = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
  MountContext ctx;
  ctx.empty_dir_fd = empty_dir_fd;
  int deferred = 0;
  auto v = make_view(r, ctx, &deferred);
  if (!v.ok()) return std::move(v).error();
  if (deferred != 0) return Error::from_errno(deferred, "open '/usr'");
  return {};
}

}  // namespace tsb::isolate
