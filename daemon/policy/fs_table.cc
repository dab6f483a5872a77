#include "daemon/policy/fs_table.h"

#include <sys/stat.h>

#include <algorithm>

namespace tsb::isolate {
namespace {

struct HostRow {
  const char* path;
  const char* reason;
};

// System directories Python needs. On a merged-/usr host /bin, /lib, ...
// are symlinks into /usr, recreated as such (kSystem).
constexpr HostRow kSystemPaths[] = {
    {"/usr", "programs, shared libraries, Python's standard library"},
    {"/bin", "merged-/usr symlink or legacy binaries"},
    {"/sbin", "merged-/usr symlink or legacy binaries"},
    {"/lib", "dynamic loader and libraries"},
    {"/lib32", "multilib loader"},
    {"/lib64", "x86-64 dynamic loader path /lib64/ld-linux-x86-64.so.2"},
    {"/libx32", "x32 libraries"},
};

// Host /etc files every run gets; those runs with a network get (TLS trust,
// protocol and service names); and those only runs with the host's network
// get (name resolution: with egress, the daemon resolves names).
constexpr HostRow kEtcAlways[] = {
    {"/etc/ld.so.cache", "the dynamic loader's library cache"},
    {"/etc/localtime", "local time zone for time.localtime()"},
};
constexpr HostRow kEtcNetwork[] = {
    {"/etc/ssl", "CA certificates and OpenSSL configuration"},
    {"/etc/ca-certificates", "CA certificate configuration"},
    {"/etc/protocols", "protocol names for socket.getprotobyname"},
    {"/etc/services", "service names for socket.getservbyname"},
};
constexpr HostRow kEtcHostNetwork[] = {
    {"/etc/resolv.conf", "DNS resolvers"},
    {"/etc/gai.conf", "getaddrinfo address sorting"},
};

// The /proc entries hidden or frozen in every sandbox. An empty read-only
// file (not /dev/null: writes to a device node succeed even on a read-only
// mount) or directory of the root tmpfs covers them, or they are bound
// read-only over themselves.
enum class ProcCover { kFile, kDir, kReadOnly, kBootId };
struct ProcRow {
  const char* path;
  ProcCover cover;
  const char* reason;
};
constexpr ProcRow kProcMasks[] = {
    {"/proc/acpi", ProcCover::kDir, "ACPI tables and event interfaces of the host"},
    {"/proc/asound", ProcCover::kDir, "sound devices of the host"},
    {"/proc/bus", ProcCover::kReadOnly, "PCI/USB device configuration space"},
    {"/proc/fs", ProcCover::kReadOnly, "file system tunables (nfsd, ...)"},
    {"/proc/cmdline", ProcCover::kFile, "the host kernel's command line (boot parameters, host infrastructure)"},
    {"/proc/irq", ProcCover::kReadOnly, "interrupt affinity of the host"},
    {"/proc/kallsyms", ProcCover::kFile, "kernel symbol addresses (KASLR)"},
    {"/proc/kcore", ProcCover::kFile, "an image of the kernel's memory"},
    {"/proc/keys", ProcCover::kFile, "keys of the kernel keyring"},
    {"/proc/latency_stats", ProcCover::kFile, "kernel latency statistics"},
    {"/proc/sched_debug", ProcCover::kFile, "scheduler state of every host task"},
    {"/proc/scsi", ProcCover::kDir, "SCSI device control"},
    {"/proc/sys", ProcCover::kReadOnly, "kernel tunables (sysctl): read-only"},
    // After /proc/sys: a bind inside the read-only /proc/sys.
    {"/proc/sys/kernel/random/boot_id", ProcCover::kBootId,
     "the host's boot id, the same in every run: a random one per run instead, so runs cannot be linked"},
    {"/proc/sysrq-trigger", ProcCover::kFile, "magic SysRq: reboot, crash, kill-all"},
    {"/proc/timer_list", ProcCover::kFile, "timers of every host task"},
    {"/proc/timer_stats", ProcCover::kFile, "timer statistics of host tasks"},
};

// Character devices in the sandbox's /dev, like the host's (a user
// namespace cannot mknod: the engine makes them).
constexpr const char* kDevices[] = {"null", "zero", "full", "random", "urandom"};

std::string ids(std::uint32_t uid, std::uint32_t gid) { return std::to_string(uid) + ":" + std::to_string(gid); }

struct Builder {
  FsTable rows;

  FsEntry& add(FsEntry::Kind kind, std::string path, Stage stage, std::string reason) {
    FsEntry e;
    e.kind = kind;
    e.path = std::move(path);
    e.stage = stage;
    e.reason = std::move(reason);
    return rows.emplace_back(std::move(e));
  }
  void file(std::string path, std::string data, std::uint32_t mode, std::string reason) {
    add(FsEntry::kFile, std::move(path), Stage::MountSkeleton, std::move(reason)).data = std::move(data);
    rows.back().mode = mode;
  }
  FsEntry& tmpfs(std::string path, std::uint64_t size, std::uint32_t inodes, std::uint32_t mode, Stage stage,
                 std::string reason) {
    FsEntry& e = add(FsEntry::kTmpfs, std::move(path), stage, std::move(reason));
    e.size = size;
    e.inodes = inodes;
    e.mode = mode;
    e.noexec = true;
    return e;
  }
};

}  // namespace

Status check_sandbox_path(const std::string& p, const char* what) {
  if (p.empty() || p[0] != '/') return Error::invalid(std::string(what) + " must be an absolute path: '" + p + "'");
  if (p.size() > 1 && p.back() == '/') return Error::invalid(std::string(what) + " must not end with '/': '" + p + "'");
  if (p.find("//") != std::string::npos || p.find('\0') != std::string::npos)
    return Error::invalid(std::string(what) + " is not a normalised path: '" + p + "'");
  std::size_t pos = 0;
  while (pos < p.size()) {
    std::size_t next = p.find('/', pos + 1);
    if (next == std::string::npos) next = p.size();
    std::string_view comp(p.data() + pos + 1, next - pos - 1);
    if (comp == "." || comp == "..") return Error::invalid(std::string(what) + " must not contain '.' or '..': '" + p + "'");
    pos = next;
  }
  if (p.size() >= 1024) return Error::invalid(std::string(what) + " is too long");
  return {};
}

Result<std::shared_ptr<const FsTable>> build_fs_table(const FsInputs& in) {
  TSB_TRY(check_sandbox_path(in.workdir, "working directory"), "file system");
  if (in.workdir == "/") return Error::invalid("file system: the working directory cannot be /");
  if (in.hostname.empty() || in.hostname.size() > 64) return Error::invalid("file system: hostname must be 1-64 bytes");
  if (in.hostname.find_first_of(std::string("\n\t \0", 4)) != std::string::npos)
    return Error::invalid("file system: hostname must not contain blanks or NUL");
  for (const auto& b : in.binds) {
    TSB_TRY(check_sandbox_path(b.target, "bind target"), "file system");
    if (b.source.empty() || b.source[0] != '/' || b.source.find('\0') != std::string::npos)
      return Error::invalid("file system: bind source must be an absolute path: '" + b.source + "'");
  }
  if (!in.venv.empty() && in.venv[0] != '/') return Error::invalid("file system: the venv must be an absolute path");
  if (!in.runner.empty() && in.runner[0] != '/') return Error::invalid("file system: the runner must be an absolute path");
  const std::string runner_dir = in.runner.substr(0, in.runner.rfind('/') + 1);  // with its '/'
  for (const std::string& f : in.runner_files)
    if (in.runner.empty() || f == in.runner || !f.starts_with(runner_dir) || !(f.ends_with(".py") || f.ends_with(".pyc")) ||
        !check_sandbox_path(f.substr(runner_dir.size() - 1), "a runner file").ok())
      return Error::invalid("file system: the runner's files must be .py and .pyc files below the runner's directory");

  Builder b;
  // 1. A fresh tmpfs becomes the root: nothing of the host is visible
  //    unless a row below puts it there.
  b.add(FsEntry::kRoot, "/", Stage::MountRoot,
        "the new root: mount points, the /etc stubs and copies of small host files; nothing of the host unless listed "
        "here")
      .size = in.root_bytes;
  b.rows.back().inodes = 4096;

  // 2. System directories, merged-/usr aware.
  for (const auto& r : kSystemPaths) {
    const bool optional = r.path != std::string_view("/usr");
    FsEntry& e = b.add(FsEntry::kSystem, r.path, Stage::MountBind, std::string(r.reason) + (optional ? " (if present)" : ""));
    e.optional = optional;
  }

  // 3. /etc: generated stubs (no host accounts, no host names) and copies of
  //    the few host files the loader and, with network, name resolution need.
  b.file("/etc/passwd",
         "root:x:0:0:sandbox init:/:/usr/sbin/nologin\n"
         "sandbox:x:" + ids(in.uid, in.gid) + ":tool:" + in.workdir + ":/usr/sbin/nologin\n"
         "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
         0644, "root (0), sandbox (" + ids(in.uid, in.gid) + ", home " + in.workdir + "), nobody: no host accounts");
  b.file("/etc/group", "root:x:0:\nsandbox:x:" + std::to_string(in.gid) + ":\nnogroup:x:65534:\n", 0644,
         "root, sandbox (" + std::to_string(in.gid) + "), nogroup");
  b.file("/etc/hostname", in.hostname + "\n", 0644, "\"" + in.hostname + "\"");
  b.file("/etc/hosts", "127.0.0.1\tlocalhost " + in.hostname + "\n::1\tlocalhost ip6-localhost ip6-loopback\n", 0644,
         "localhost and \"" + in.hostname + "\" only");
  b.file("/etc/nsswitch.conf", "passwd: files\ngroup: files\nhosts: files dns\n", 0644,
         "accounts from files; host names from files, then DNS");
  for (const auto& r : kEtcAlways) b.add(FsEntry::kSystem, r.path, Stage::MountBind, std::string(r.reason) + " (if present)").optional = true;
  if (in.network != NetworkMode::None)
    for (const auto& r : kEtcNetwork)
      b.add(FsEntry::kSystem, r.path, Stage::MountBind, std::string(r.reason) + " (if present; network host or egress)")
          .optional = true;
  if (in.network == NetworkMode::Host)
    for (const auto& r : kEtcHostNetwork)
      b.add(FsEntry::kSystem, r.path, Stage::MountBind, std::string(r.reason) + " (if present; network host only)")
          .optional = true;

  // 4. The venv, read-only at a fixed path.
  if (!in.venv.empty()) b.add(FsEntry::kHost, std::string(kVenvPath), Stage::MountBind, "the Python environment").source = in.venv;

  // 5. Writable scratch space, size-limited, charged to the run's memory
  //    cgroup; nothing written there is executable.
  b.tmpfs("/tmp", in.tmp_bytes, 16384, 01777, Stage::MountTmpfs, "scratch space, mode 1777; counts toward memory");
  b.tmpfs(in.workdir, in.work_bytes, 16384, 0700, Stage::MountTmpfs,
          "working directory, mode 0700, owned by " + ids(in.uid, in.gid) + "; counts toward memory")
      .tool_owned = true;

  // 6. Extra host paths, shallowest first so one inside another lands on
  //    top of it; the runner last (tool mode).
  std::vector<const BindMount*> binds;
  for (const auto& m : in.binds) binds.push_back(&m);
  std::stable_sort(binds.begin(), binds.end(), [](const BindMount* x, const BindMount* y) {
    return std::count(x->target.begin(), x->target.end(), '/') < std::count(y->target.begin(), y->target.end(), '/');
  });
  for (const BindMount* m : binds) {
    FsEntry& e = b.add(m->writable ? FsEntry::kBind : FsEntry::kHost, m->target, Stage::MountBind,
                       m->writable ? "READ-WRITE: the tool can change these host files (mountinfo shows the host path)"
                                   : "extra path from the policy: a directory as a view, a small file as a copy");
    e.source = m->source;
    e.optional = m->optional;
    if (m->optional) e.reason += " (skipped when missing)";
  }
  if (!in.runner.empty()) {
    b.add(FsEntry::kHost, std::string(kRunnerSandboxPath), Stage::MountBind,
          "the trusted tool runner (tool mode only)")
        .source = in.runner;
    for (const std::string& f : in.runner_files)
      b.add(FsEntry::kHost, std::string(kRunnerSandboxDir) + f.substr(runner_dir.size() - 1), Stage::MountBind,
            f.ends_with(".pyc") ? "the runner's bytecode, used while it matches its module's source (tool mode only)"
                                : "a module of the trusted tool runner's package (tool mode only)")
          .source = f;
  }

  // 7. A new /proc for the new pid namespace, host-wide entries covered by
  //    objects of the root tmpfs that init makes for each mask, under
  //    /.masks (read-only once built).
  b.add(FsEntry::kProc, "/proc", Stage::MountProc, "processes of this pid namespace only").mode = 0555;
  for (const auto& m : kProcMasks) {
    if (m.cover == ProcCover::kReadOnly) {
      b.add(FsEntry::kReadOnly, m.path, Stage::MaskProc, std::string(m.reason) + " (if present)");
      continue;
    }
    FsEntry& e = b.add(m.cover == ProcCover::kBootId ? FsEntry::kBootId : FsEntry::kMask, m.path, Stage::MaskProc,
                       std::string(m.reason) + " (if present)");
    e.source = "/.masks/" + e.path.substr(e.path.rfind('/') + 1);
    e.mode = m.cover == ProcCover::kDir ? S_IFDIR | 0555 : S_IFREG | 0444;
  }

  // 8. A minimal /dev: a tmpfs the engine fills (binding the host's
  //    devtmpfs would show its size, half the host's memory, in
  //    mountinfo), read-only, so the only writable place in it is the small
  //    /dev/shm.
  {
    FsEntry& dev = b.add(FsEntry::kDev, "/dev", Stage::MountDev,
                         "made by the engine with the device nodes and links below, then read-only; mode 0755");
    dev.size = 64u << 10;
    dev.inodes = 64;
    dev.noexec = true;
  }
  for (const char* d : kDevices)
    b.add(FsEntry::kDevNode, std::string("/dev/") + d, Stage::MountDev,
          "character device node (/dev is the only mount without nodev)")
        .source = std::string("/dev/") + d;
  for (const auto& [link, target] : {std::pair{"/dev/fd", "/proc/self/fd"}, {"/dev/stdin", "/proc/self/fd/0"},
                                     {"/dev/stdout", "/proc/self/fd/1"}, {"/dev/stderr", "/proc/self/fd/2"}})
    b.add(FsEntry::kSymlink, link, Stage::MountDev, "").source = target;
  b.add(FsEntry::kDir, "/dev/shm", Stage::MountDev, "mount point of /dev/shm");
  b.tmpfs("/dev/shm", std::min<std::uint64_t>(in.tmp_bytes, 64ull << 20), 0, 01777, Stage::MountDev,
          "POSIX shared memory, mode 1777; counts toward memory");
  return std::make_shared<const FsTable>(std::move(b.rows));
}

}  // namespace tsb::isolate
