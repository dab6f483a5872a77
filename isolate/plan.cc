#include "isolate/plan.h"

#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <climits>

namespace tsb::isolate {
namespace {

// System directories Python needs, bound read-only. On a merged-/usr host
// /bin, /lib, ... are symlinks into /usr: they are recreated as symlinks.
constexpr SystemPath kSystemPaths[] = {
    {"/usr", "programs, shared libraries, Python's standard library"},
    {"/bin", "merged-/usr symlink or legacy binaries"},
    {"/sbin", "merged-/usr symlink or legacy binaries"},
    {"/lib", "dynamic loader and libraries"},
    {"/lib32", "multilib loader"},
    {"/lib64", "x86-64 dynamic loader path /lib64/ld-linux-x86-64.so.2"},
    {"/libx32", "x32 libraries"},
};

// Read-only single files from the host's /etc that every run gets.
constexpr SystemPath kEtcAlways[] = {
    {"/etc/ld.so.cache", "the dynamic loader's library cache"},
    {"/etc/localtime", "local time zone for time.localtime()"},
};
// Only with network access: name resolution and TLS trust.
constexpr SystemPath kEtcNetwork[] = {
    {"/etc/resolv.conf", "DNS resolvers"},
    {"/etc/ssl", "CA certificates and OpenSSL configuration"},
    {"/etc/ca-certificates", "CA certificate configuration"},
    {"/etc/protocols", "protocol names for socket.getprotobyname"},
    {"/etc/services", "service names for socket.getservbyname"},
    {"/etc/gai.conf", "getaddrinfo address sorting"},
};

// Character devices bound from the host into the sandbox's /dev (a user
// namespace cannot mknod).
constexpr const char* kDevices[] = {"null", "zero", "full", "random", "urandom"};

constexpr std::uint64_t kRO = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
constexpr std::uint64_t kRW = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;

struct Builder {
  const PlanInputs& in;
  PlanStorage& st;

  std::string host(const std::string& sandbox_path) const { return in.staging_root + sandbox_path; }

  MountStep& add(MountStep::Kind k, Stage stage) {
    MountStep s{};
    s.kind = k;
    s.stage = stage;
    return st.steps.emplace_back(s);
  }

  void mkdirs(const std::string& sandbox_path, unsigned mode = 0755) {
    std::size_t pos = 1;
    while (pos <= sandbox_path.size()) {
      std::size_t next = sandbox_path.find('/', pos);
      if (next == std::string::npos) next = sandbox_path.size();
      std::string part = sandbox_path.substr(0, next);
      if (st.made_dirs.insert(part).second) {
        auto& s = add(MountStep::kMkdir, Stage::MountSkeleton);
        s.dst = st.keep(host(part));
        s.mode = mode;
      }
      pos = next + 1;
    }
  }

  void parent_dirs(const std::string& sandbox_path) {
    auto slash = sandbox_path.rfind('/');
    if (slash > 0) mkdirs(sandbox_path.substr(0, slash));
  }

  void symlink(const std::string& target, const std::string& sandbox_path) {
    parent_dirs(sandbox_path);
    auto& s = add(MountStep::kSymlink, Stage::MountSkeleton);
    s.src = st.keep(target);
    s.dst = st.keep(host(sandbox_path));
  }

  void write_file(const std::string& sandbox_path, std::string contents, unsigned mode = 0644) {
    parent_dirs(sandbox_path);
    auto& s = add(MountStep::kWriteFile, Stage::MountSkeleton);
    s.dst = st.keep(host(sandbox_path));
    s.len = contents.size();
    s.data = st.keep(std::move(contents));
    s.mode = mode;
  }

  void bind(const std::string& src, const std::string& sandbox_path, std::uint64_t attrs, bool optional,
            Stage stage = Stage::MountBind) {
    struct stat sb{};
    if (::stat(src.c_str(), &sb) != 0) {
      if (optional) return;
      // Reported by the child with ENOENT; the parent does not guess.
    }
    bool dir = S_ISDIR(sb.st_mode);
    if (dir) {
      // The mount point itself is created by the step; only its parents here.
      parent_dirs(sandbox_path);
      st.made_dirs.insert(sandbox_path);
    } else {
      parent_dirs(sandbox_path);
    }
    auto& s = add(MountStep::kBind, stage);
    s.src = st.keep(src);
    s.dst = st.keep(host(sandbox_path));
    s.attr_set = attrs;
    s.is_dir = dir;
    s.optional = optional;
  }

  // A host path that may be a symlink (merged /usr, /etc/localtime): the
  // symlink is recreated as is, a directory or file is bound read-only.
  void system_path(const char* path, bool optional) {
    struct stat sb{};
    if (::lstat(path, &sb) != 0) {
      if (!optional) bind(path, path, kRO, false);
      return;
    }
    if (S_ISLNK(sb.st_mode)) {
      char target[PATH_MAX];
      ssize_t n = ::readlink(path, target, sizeof target - 1);
      if (n > 0) {
        target[n] = '\0';
        symlink(target, path);
        // An absolute target outside what we bind (resolv.conf pointing into
        // /run) would dangle: bind the resolved file instead.
        if (target[0] == '/' && std::string(target).rfind("/usr/", 0) != 0) {
          st.steps.pop_back();
          char real[PATH_MAX];
          if (::realpath(path, real) != nullptr) bind(real, path, kRO, optional);
        }
      }
      return;
    }
    bind(path, path, kRO, optional);
  }

  void tmpfs(const std::string& sandbox_path, const std::string& data, std::uint64_t attrs, Stage stage) {
    parent_dirs(sandbox_path);
    st.made_dirs.insert(sandbox_path);
    auto& s = add(MountStep::kMount, stage);
    s.src = "tmpfs";
    s.fstype = "tmpfs";
    s.dst = st.keep(host(sandbox_path));
    s.flags = MS_NOSUID | MS_NODEV;
    s.data = st.keep(data);
    s.attr_set = attrs;
  }
};

std::string passwd_file(const RunSpec& spec) {
  return "root:x:0:0:sandbox init:/:/usr/sbin/nologin\n"
         "sandbox:x:" + std::to_string(spec.sandbox_uid) + ":" + std::to_string(spec.sandbox_gid) +
         ":tool:" + spec.workdir + ":/usr/sbin/nologin\n"
         "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n";
}

std::string group_file(const RunSpec& spec) {
  return "root:x:0:\nsandbox:x:" + std::to_string(spec.sandbox_gid) + ":\nnogroup:x:65534:\n";
}

}  // namespace

std::span<const SystemPath> system_paths() { return kSystemPaths; }
std::span<const SystemPath> etc_paths_always() { return kEtcAlways; }
std::span<const SystemPath> etc_paths_network() { return kEtcNetwork; }
std::span<const char* const> device_names() { return kDevices; }

const std::vector<ProcMask>& proc_masks() {
  static const std::vector<ProcMask> masks = {
      {"/acpi", ProcMask::kDir, "ACPI tables and event interfaces of the host"},
      {"/asound", ProcMask::kDir, "sound devices of the host"},
      {"/bus", ProcMask::kReadOnly, "PCI/USB device configuration space"},
      {"/fs", ProcMask::kReadOnly, "file system tunables (nfsd, ...)"},
      {"/irq", ProcMask::kReadOnly, "interrupt affinity of the host"},
      {"/kallsyms", ProcMask::kFile, "kernel symbol addresses (KASLR)"},
      {"/kcore", ProcMask::kFile, "an image of the kernel's memory"},
      {"/keys", ProcMask::kFile, "keys of the kernel keyring"},
      {"/latency_stats", ProcMask::kFile, "kernel latency statistics"},
      {"/sched_debug", ProcMask::kFile, "scheduler state of every host task"},
      {"/scsi", ProcMask::kDir, "SCSI device control"},
      {"/sys", ProcMask::kReadOnly, "kernel tunables (sysctl): read-only"},
      {"/sysrq-trigger", ProcMask::kFile, "magic SysRq: reboot, crash, kill-all"},
      {"/timer_list", ProcMask::kFile, "timers of every host task"},
      {"/timer_stats", ProcMask::kFile, "timer statistics of host tasks"},
  };
  return masks;
}

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

Status build_plan(const PlanInputs& in, PlanStorage& st, ChildPlan& plan) {
  const RunSpec& spec = *in.spec;
  Builder b{in, st};

  if (spec.argv.empty()) return Error::invalid("no command to run");
  for (const auto& a : spec.argv)
    if (a.find('\0') != std::string::npos) return Error::invalid("an argument contains a NUL byte");
  if (spec.argv[0].empty()) return Error::invalid("the command name is empty");
  TSB_TRY(check_sandbox_path(spec.workdir, "working directory"), "run spec");
  if (spec.hostname.empty() || spec.hostname.size() > 64) return Error::invalid("hostname must be 1-64 bytes");

  // 1. System directories (merged-/usr aware) and the loader's files.
  for (const auto& p : kSystemPaths) b.system_path(p.path, p.path != std::string("/usr"));

  // 2. /etc: generated stubs (no host accounts, no host names) plus the few
  //    host files the loader and, with network, name resolution need.
  b.mkdirs("/etc");
  b.write_file("/etc/passwd", passwd_file(spec));
  b.write_file("/etc/group", group_file(spec));
  b.write_file("/etc/hostname", spec.hostname + "\n");
  b.write_file("/etc/hosts", "127.0.0.1\tlocalhost " + spec.hostname + "\n::1\tlocalhost ip6-localhost ip6-loopback\n");
  b.write_file("/etc/nsswitch.conf", "passwd: files\ngroup: files\nhosts: files dns\n");
  for (const auto& p : kEtcAlways) b.system_path(p.path, true);
  if (spec.network == NetworkMode::Host)
    for (const auto& p : kEtcNetwork) b.system_path(p.path, true);

  // 3. The venv, read-only at a fixed path.
  if (!spec.venv.empty()) b.bind(spec.venv, std::string(kVenvPath), kRO, false);

  // 4. Writable scratch space, size-limited, charged to the run's memory
  //    cgroup; nothing written there is executable.
  const auto& lim = spec.limits;
  b.tmpfs("/tmp", "size=" + std::to_string(lim.tmp_bytes) + ",mode=1777,nr_inodes=16384",
          kRW | MOUNT_ATTR_NOEXEC, Stage::MountTmpfs);
  b.tmpfs(spec.workdir,
          "size=" + std::to_string(lim.work_bytes) + ",mode=0700,nr_inodes=16384,uid=" +
              std::to_string(spec.sandbox_uid) + ",gid=" + std::to_string(spec.sandbox_gid),
          kRW | MOUNT_ATTR_NOEXEC, Stage::MountTmpfs);

  // 5. Extra binds from the policy or the command line, shallowest first so
  //    a bind inside another lands on top of it.
  std::vector<const BindMount*> binds;
  for (const auto& m : spec.binds) {
    TSB_TRY(check_sandbox_path(m.target, "bind target"), "run spec");
    if (m.source.empty() || m.source[0] != '/') return Error::invalid("bind source must be absolute: '" + m.source + "'");
    binds.push_back(&m);
  }
  std::stable_sort(binds.begin(), binds.end(), [](const BindMount* a, const BindMount* c) {
    return std::count(a->target.begin(), a->target.end(), '/') < std::count(c->target.begin(), c->target.end(), '/');
  });
  for (const BindMount* m : binds) b.bind(m->source, m->target, m->writable ? kRW : kRO, m->optional);

  // 6. A new /proc for the new pid namespace, with host-wide entries masked.
  {
    b.mkdirs("/proc", 0555);
    auto& s = b.add(MountStep::kMount, Stage::MountProc);
    s.src = "proc";
    s.fstype = "proc";
    s.dst = st.keep(b.host("/proc"));
    s.flags = MS_NOSUID | MS_NODEV | MS_NOEXEC;
    s.data = nullptr;
    // Masked files get an empty read-only regular file bound over them, not
    // /dev/null: writes to a device node succeed even on a read-only mount.
    b.write_file("/.masked", "", 0444);
    const char* masked = st.keep(b.host("/.masked"));
    for (const auto& m : proc_masks()) {
      std::string path = b.host("/proc") + m.path;
      if (m.kind == ProcMask::kReadOnly) {
        auto& r = b.add(MountStep::kBind, Stage::MaskProc);
        r.src = st.keep(path);
        r.dst = r.src;
        r.is_dir = true;
        r.optional = true;
        r.attr_set = kRO | MOUNT_ATTR_NOEXEC;
      } else {
        auto& r = b.add(m.kind == ProcMask::kFile ? MountStep::kMaskFile : MountStep::kMaskDir, Stage::MaskProc);
        r.dst = st.keep(path);
        r.src = masked;
      }
    }
  }

  // 7. A minimal /dev: five character devices bound from the host (a user
  //    namespace cannot mknod), the usual symlinks, and a small /dev/shm.
  b.tmpfs("/dev", "size=64k,mode=0755,nr_inodes=64", MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC, Stage::MountDev);
  for (const char* dev : kDevices) {
    std::string p = std::string("/dev/") + dev;
    auto& s = b.add(MountStep::kBind, Stage::MountDev);
    s.src = st.keep(p);
    s.dst = st.keep(b.host(p));
    s.attr_set = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC;  // not nodev: these are the devices
    s.is_dir = false;
  }
  b.symlink("/proc/self/fd", "/dev/fd");
  b.symlink("/proc/self/fd/0", "/dev/stdin");
  b.symlink("/proc/self/fd/1", "/dev/stdout");
  b.symlink("/proc/self/fd/2", "/dev/stderr");
  b.tmpfs("/dev/shm", "size=" + std::to_string(std::min<std::uint64_t>(lim.tmp_bytes, 64ull << 20)) + ",mode=1777",
          kRW | MOUNT_ATTR_NOEXEC, Stage::MountDev);

  // 8. The tool's command line and environment, exactly as given.
  for (const auto& a : spec.argv) st.argv.push_back(st.keep(a));
  st.argv.push_back(nullptr);
  std::string path_value = std::string(kVenvPath) + "/bin:/usr/local/bin:/usr/bin:/bin";
  for (const auto& e : spec.env) {
    if (e.find('=') == std::string::npos || e[0] == '=' || e.find('\0') != std::string::npos)
      return Error::invalid("environment entries must be KEY=VALUE");
    if (e.rfind("PATH=", 0) == 0) path_value = e.substr(5);
    st.envp.push_back(st.keep(e));
  }
  st.envp.push_back(nullptr);

  // 9. Per-process limits (the cgroup holds the run-wide ones).
  st.rlimits.push_back({RLIMIT_CORE, 0});
  st.rlimits.push_back({RLIMIT_FSIZE, static_cast<rlim_t>(lim.file_size_bytes)});
  st.rlimits.push_back({RLIMIT_NOFILE, static_cast<rlim_t>(lim.open_files)});
  // Each run has host uids of its own, so RLIMIT_NPROC counts exactly this
  // run's processes: a second fence behind pids.max.
  st.rlimits.push_back({RLIMIT_NPROC, static_cast<rlim_t>(lim.pids)});
  if (lim.cpu_time.count() > 0) {
    auto secs = static_cast<rlim_t>((lim.cpu_time.count() + 999) / 1000);
    st.rlimits.push_back({RLIMIT_CPU, secs + 1});  // backstop; the engine measures the whole cgroup
  }

  plan.root = st.keep(in.staging_root);
  plan.root_tmpfs_data = st.keep("size=" + std::to_string(in.root_tmpfs_bytes) + ",mode=0755,nr_inodes=4096");
  plan.steps = st.steps.data();
  plan.nsteps = st.steps.size();
  plan.hostname = st.keep(spec.hostname);
  plan.loopback_up = spec.network == NetworkMode::None;
  plan.argv = st.argv.data();
  plan.envp = st.envp.data();
  plan.path_search = st.keep(path_value);
  plan.workdir = st.keep(spec.workdir);
  plan.tool_uid = spec.sandbox_uid;
  plan.tool_gid = spec.sandbox_gid;
  plan.rlimits = st.rlimits.data();
  plan.nrlimits = st.rlimits.size();
  return {};
}

}  // namespace tsb::isolate
