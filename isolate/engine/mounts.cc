#include "isolate/engine/mounts.h"

#include <fcntl.h>
#include <linux/mount.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "isolate/base/wire.h"
#include "isolate/engine/plan.h"

namespace tsb::isolate {
namespace {

// glibc 2.36 wraps none of the new mount API.
int sys_fsopen(const char* fs, unsigned flags) { return static_cast<int>(::syscall(SYS_fsopen, fs, flags)); }
int sys_fsconfig(int fd, unsigned cmd, const char* key, const char* value) {
  return static_cast<int>(::syscall(SYS_fsconfig, fd, cmd, key, value, 0));
}
int sys_fsmount(int fd, unsigned attrs) { return static_cast<int>(::syscall(SYS_fsmount, fd, FSMOUNT_CLOEXEC, attrs)); }
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

constexpr std::uint64_t kNoSuidNoDev = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
constexpr std::uint64_t kReadOnly = MOUNT_ATTR_RDONLY | kNoSuidNoDev;

// A tmpfs whose root directory belongs to sandbox ids uid:gid. Owned by
// the engine when made, so its options carry no uid=/gid=; chowned after.
Result<UniqueFd> make_tmpfs(std::uint64_t size, std::uint32_t inodes, std::uint32_t mode, std::uint64_t attrs,
                            std::uint32_t host_uid, std::uint32_t host_gid) {
  char options[96];
  std::snprintf(options, sizeof options, "size=%llu,mode=%04o", static_cast<unsigned long long>(size), mode);
  std::string opts = options;
  if (inodes) opts += ",nr_inodes=" + std::to_string(inodes);
  auto m = make_fs("tmpfs", opts, attrs);
  if (!m.ok()) return std::move(m).error().wrap("tmpfs");
  if (::fchownat(m->get(), "", host_uid, host_gid, AT_EMPTY_PATH) != 0) return Error::from_errno("chown tmpfs root");
  return m;
}

// What a host directory or file, opened as `fd`, becomes. Read-only
// directories: an overlay with it as its only content (the empty directory
// below it makes a read-only overlay valid on kernels that want two lower
// layers). The rest (a writable bind, a file too large to copy, overlays
// turned off): a clone of the host's mount tree at it.
Result<UniqueFd> open_view(int fd, const std::string& host_path, bool is_dir, bool writable, const MountContext& ctx) {
  const std::uint64_t attrs = writable ? kNoSuidNoDev : kReadOnly;
  if (is_dir && !writable && ctx.overlay_views) {
    std::string lower =
        "lowerdir=/proc/self/fd/" + std::to_string(fd) + ":/proc/self/fd/" + std::to_string(ctx.empty_dir_fd);
    auto m = make_fs("overlay", lower, attrs);
    if (!m.ok()) return std::move(m).error().wrap("read-only view of '" + host_path + "'");
    return m;
  }
  UniqueFd t(static_cast<int>(
      ::syscall(SYS_open_tree, fd, "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE | AT_EMPTY_PATH)));
  if (!t) return Error::from_errno("clone of '" + host_path + "'");
  // The clone is in the peer group of the host's mount at that path (when
  // that one is shared): made private, so that nothing mounted on or below
  // it inside the sandbox (a nested bind) propagates back to the host, and
  // no host mount event reaches the sandbox. init's MS_REC|MS_PRIVATE on
  // its tree does not reach mounts attached after it.
  if (sys_mount_setattr(t.get(), attrs, true, MS_PRIVATE) != 0)
    return Error::from_errno("mount_setattr on the bind of '" + host_path + "'");
  return t;
}

// A host path, opened once and used only through that descriptor, with no
// symlink followed anywhere in it: a link planted in a writable host
// directory (a bind runs see) cannot make root read or show another file,
// nor can a swap between a check and a use. -1 and errno on failure.
int open_host_path(const std::string& path) {
  struct open_how how {};
  how.flags = O_PATH | O_CLOEXEC;
  how.resolve = RESOLVE_NO_SYMLINKS;
  return static_cast<int>(::syscall(SYS_openat2, AT_FDCWD, path.c_str(), &how, sizeof how));
}

// Builds the plan's steps (isolate/engine/plan.h) and owns what they refer to.
struct Steps {
  PreparedFs& out;
  Writer w;
  std::uint64_t copied = 0;  // bytes of host files copied into the root tmpfs

  void step(Op op, const FsEntry& e, std::string_view source, std::string_view data, int fd = -1, int err = 0,
            std::uint32_t mode = 0, bool dir = false) {
    w.u8(static_cast<std::uint8_t>(op));
    w.u8(static_cast<std::uint8_t>(e.stage));
    // Whether the mount is writable or noexec, for the tool's Landlock rules
    // (every tmpfs is noexec, prepare_fs below).
    const bool tmpfs = e.kind == FsEntry::kTmpfs;
    w.u8((dir ? kStepDir : 0) | (e.optional ? kStepOptional : 0) | (tmpfs || e.kind == FsEntry::kBind ? kStepWritable : 0) |
         (tmpfs || e.kind == FsEntry::kDev ? kStepNoExec : 0));
    w.u32(mode);
    w.i32(fd);
    w.i32(err);
    w.cstr(e.path);
    w.cstr(source);
    w.cstr(data);
    out.paths.push_back(e.path);
    ++out.nsteps;
  }
  void attach(const FsEntry& e, UniqueFd fd, int err, bool dir) {
    step(Op::kAttach, e, "", "", fd ? fd.get() : -1, err, 0, dir);
    if (fd) out.fds.push_back(std::move(fd));
  }

  // A host path shown read-only (a view, a copy or a bind) or read-write.
  // A missing optional path is skipped; any other failure to open it is
  // init's to report at the row's stage.
  Status host_path(const FsEntry& e, const std::string& src, bool writable, const MountContext& ctx) {
    UniqueFd f(open_host_path(src));
    struct stat sb{};
    if (!f || ::fstat(f.get(), &sb) != 0) {
      if (e.optional && (errno == ENOENT || errno == ENOTDIR)) return {};
      attach(e, UniqueFd(), errno, true);
      return {};
    }
    const bool dir = S_ISDIR(sb.st_mode);
    if (!dir && !writable && S_ISREG(sb.st_mode) && static_cast<std::uint64_t>(sb.st_size) <= kMaxCopiedFileBytes) {
      // Init copies it from this descriptor (the bytes never pass through
      // this process or the plan); read-only like the bind it replaces,
      // its exec bits kept. Non-blocking: no lease holder can stall the
      // open. Budgeted at the most init copies (until EOF, at most
      // kMaxCopiedFileBytes), so a file grown since fstat still fits.
      if (UniqueFd r(::open(("/proc/self/fd/" + std::to_string(f.get())).c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC)); r) {
        copied += kMaxCopiedFileBytes;
        step(Op::kCopyFile, e, "", "", r.get(), 0, static_cast<std::uint32_t>(sb.st_mode & 0555));
        out.fds.push_back(std::move(r));
        return {};
      }
      if (e.optional) return {};
    }
    auto v = open_view(f.get(), src, dir, writable, ctx);
    // context: open_view names the operation and the host path
    if (!v.ok()) return std::move(v).error();
    attach(e, std::move(v).value(), 0, dir);
    return {};
  }

  // A host path as the host has it: a symlink is recreated as that symlink,
  // unless it points outside what is shown (resolv.conf into /run): then
  // the file it resolves to is shown.
  Status system_path(const FsEntry& e, const MountContext& ctx) {
    struct stat sb{};
    if (::lstat(e.path.c_str(), &sb) != 0) return e.optional ? Status{} : host_path(e, e.path, false, ctx);
    if (!S_ISLNK(sb.st_mode)) return host_path(e, e.path, false, ctx);
    char target[PATH_MAX];
    const ssize_t n = ::readlink(e.path.c_str(), target, sizeof target - 1);
    if (n <= 0) return {};
    target[n] = '\0';
    if (target[0] != '/' || std::string_view(target).starts_with("/usr/")) {
      step(Op::kSymlink, e, target, "");
      return {};
    }
    char real[PATH_MAX];
    if (::realpath(e.path.c_str(), real) == nullptr) return {};  // dangling on the host: nothing to show
    return host_path(e, real, false, ctx);
  }
};

// A row inside the /dev tmpfs, made there by the engine (the sandbox may
// not mknod). Modes are set explicitly: the engine's umask (0077 under
// systemd) must not decide who may open /dev/null.
Status make_in_dev(int dev, const std::string& name, const FsEntry& e) {
  switch (e.kind) {
    case FsEntry::kDevNode: {
      // Only the five every sandbox has: nothing the table says can give a
      // sandbox another device.
      static constexpr std::string_view kDevices[] = {"null", "zero", "full", "random", "urandom"};
      if (std::find(std::begin(kDevices), std::end(kDevices), name) == std::end(kDevices) || e.source != "/dev/" + name)
        return Error::invalid("'" + e.path + "' is not a device a sandbox may have", EPERM);
      struct stat st{};
      if (::stat(e.source.c_str(), &st) != 0) return Error::from_errno("stat '" + e.source + "'");
      if (!S_ISCHR(st.st_mode)) return Error::invalid("'" + e.source + "' is not a character device", ENODEV);
      if (::mknodat(dev, name.c_str(), S_IFCHR | 0666, st.st_rdev) != 0 || ::fchmodat(dev, name.c_str(), 0666, 0) != 0)
        return Error::from_errno("mknod " + e.path);
      return {};
    }
    case FsEntry::kSymlink:
      if (::symlinkat(e.source.c_str(), dev, name.c_str()) != 0) return Error::from_errno("symlink " + e.path);
      return {};
    default:
      if (::mkdirat(dev, name.c_str(), e.mode) != 0 || ::fchmodat(dev, name.c_str(), e.mode, 0) != 0)
        return Error::from_errno("mkdir " + e.path);
      return {};
  }
}

}  // namespace

Result<PreparedFs> prepare_fs(const FsTable& table, const MountContext& ctx) {
  PreparedFs out;
  Steps s{out, {}};
  if (table.empty() || table.front().kind != FsEntry::kRoot) return Error::invalid("a file-system table starts with its root");
  const FsEntry& root = table.front();
  const auto host_uid = [&](std::uint32_t id) { return ctx.host_id_base + id; };
  int dev = -1;
  std::string dev_prefix;
  for (std::size_t i = 1; i < table.size(); ++i) {
    const FsEntry& e = table[i];
    if (dev >= 0 && e.path.starts_with(dev_prefix) &&
        (e.kind == FsEntry::kDevNode || e.kind == FsEntry::kSymlink || e.kind == FsEntry::kDir)) {
      const std::string name = e.path.substr(dev_prefix.size());
      if (name.find('/') != std::string::npos) return Error::invalid("'" + e.path + "': only names directly in /dev");
      TSB_TRY(make_in_dev(dev, name, e), "populating /dev");
      if (e.kind == FsEntry::kDevNode) s.step(Op::kDevice, e, "", "");
      continue;
    }
    switch (e.kind) {
      case FsEntry::kSystem: TSB_TRY(s.system_path(e, ctx), e.path); break;
      case FsEntry::kHost: TSB_TRY(s.host_path(e, e.source, false, ctx), e.path); break;
      case FsEntry::kBind: TSB_TRY(s.host_path(e, e.source, true, ctx), e.path); break;
      case FsEntry::kTmpfs:
      case FsEntry::kDev: {
        // Nothing written in a sandbox is executable, whatever the table
        // says; /dev is the one mount with devices, and there is one.
        if (e.kind == FsEntry::kDev && (dev >= 0 || e.path != "/dev"))
          return Error::invalid("'" + e.path + "': the table has one /dev");
        const bool tool = e.tool_owned;
        const std::uint64_t attrs =
            (e.kind == FsEntry::kDev ? MOUNT_ATTR_NOSUID : kNoSuidNoDev) | MOUNT_ATTR_NOEXEC;
        auto m = make_tmpfs(e.size, e.inodes, e.mode, attrs, host_uid(tool ? ctx.tool_uid : 0),
                            host_uid(tool ? ctx.tool_gid : 0));
        if (!m.ok()) return std::move(m).error().wrap("tmpfs for " + e.path);
        if (e.kind == FsEntry::kDev) {
          dev = m->get();
          dev_prefix = e.path + "/";
        }
        s.attach(e, std::move(m).value(), 0, true);
        break;
      }
      case FsEntry::kDir: s.step(Op::kMkdir, e, "", "", -1, 0, e.mode); break;
      case FsEntry::kSymlink: s.step(Op::kSymlink, e, e.source, ""); break;
      case FsEntry::kFile: s.step(Op::kWriteFile, e, "", e.data, -1, 0, e.mode); break;
      case FsEntry::kProc: s.step(Op::kProc, e, "", "", -1, 0, e.mode); break;
      case FsEntry::kBootId:
      case FsEntry::kMask:
        s.step(e.kind == FsEntry::kMask ? Op::kMask : Op::kBootId, e, e.source, "", -1, 0, e.mode & 07777, S_ISDIR(e.mode));
        break;
      case FsEntry::kReadOnly: s.step(Op::kReadOnly, e, "", ""); break;
      case FsEntry::kRoot:
      case FsEntry::kDevNode: return Error::invalid("'" + e.path + "': a root or device row out of place");
    }
  }
  // /dev is final: read-only (its /dev/shm is a mount of its own).
  if (dev >= 0 && sys_mount_setattr(dev, MOUNT_ATTR_RDONLY, false) != 0) return Error::from_errno("making /dev read-only");
  // The root: the skeleton, the generated files and the copies.
  auto r = make_tmpfs(root.size + s.copied, root.inodes, 0755, kNoSuidNoDev, host_uid(0), host_uid(0));
  if (!r.ok()) return std::move(r).error().wrap("the root tmpfs");
  out.root = std::move(r).value();
  out.steps = s.w.take();
  return out;
}

Status probe_overlay_views(int empty_dir_fd) {
  MountContext ctx;
  ctx.empty_dir_fd = empty_dir_fd;
  UniqueFd usr(open_host_path("/usr"));
  if (!usr) return Error::from_errno("open '/usr'");
  auto v = open_view(usr.get(), "/usr", true, false, ctx);
  // context: open_view names the operation and the host path
  if (!v.ok()) return std::move(v).error();
  return {};
}

}  // namespace tsb::isolate
