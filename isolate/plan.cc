#include "isolate/plan.h"

#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fcntl.h>

#include <algorithm>
#include <climits>
#include <optional>

#include "isolate/base/file.h"
#include "isolate/base/random.h"
#include "isolate/base/unique_fd.h"

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
  std::uint64_t copied_bytes = 0;  // file contents written into the root tmpfs

  std::string host(const std::string& sandbox_path) const { return in.staging_root + sandbox_path; }

  MountStep& add(MountStep::Kind k, Stage stage) {
    MountStep s{};
    s.kind = k;
    s.stage = stage;
    s.fd = -1;
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

  void write_file(const std::string& sandbox_path, std::string contents, unsigned mode = 0644,
                  Stage stage = Stage::MountSkeleton) {
    parent_dirs(sandbox_path);
    copied_bytes += contents.size();
    auto& s = add(MountStep::kWriteFile, stage);
    s.dst = st.keep(host(sandbox_path));
    s.len = contents.size();
    s.data = st.keep(std::move(contents));
    s.mode = mode;
  }

  // A kAttach step at `sandbox_path` and the request that makes its mount.
  MountRequest& attach(const std::string& sandbox_path, bool dir, bool optional, Stage stage, MountRequest::Kind kind) {
    parent_dirs(sandbox_path);
    if (dir) st.made_dirs.insert(sandbox_path);
    auto& s = add(MountStep::kAttach, stage);
    s.dst = st.keep(host(sandbox_path));
    s.is_dir = dir;
    s.optional = optional;
    MountRequest r{};
    r.kind = kind;
    r.step = st.steps.size() - 1;
    r.is_dir = dir;
    return st.mounts.emplace_back(std::move(r));
  }

  // A host path, read-only unless `writable`: a directory becomes a view
  // (mounts.h), a small read-only file is copied into the root tmpfs, a
  // larger one or a writable path is bound. A missing source fails the run
  // at this step (the child reports the parent's ENOENT), or is skipped
  // when optional.
  void host_path(const std::string& src, const std::string& sandbox_path, bool writable, bool optional,
                 Stage stage = Stage::MountBind) {
    struct stat sb{};
    if (::stat(src.c_str(), &sb) != 0) {
      if (optional) return;
      sb.st_mode = S_IFDIR;  // the request fails when it is made; the child reports it
    }
    const bool dir = S_ISDIR(sb.st_mode);
    if (!dir && !writable && S_ISREG(sb.st_mode) && static_cast<std::uint64_t>(sb.st_size) <= kMaxCopiedFileBytes) {
      if (auto data = read_file(src, {.max_bytes = kMaxCopiedFileBytes, .regular_only = true}); data.ok()) {
        // Read-only like the bind it replaces; its exec bits are kept.
        write_file(sandbox_path, std::move(*data), static_cast<unsigned>(sb.st_mode & 0555), stage);
        return;
      }
      if (optional) return;
    }
    MountRequest& r = attach(sandbox_path, dir, optional, stage, MountRequest::kView);
    r.host_path = src;
    r.writable = writable;
    r.attrs = writable ? kRW : kRO;
  }

  // A host path that may be a symlink (merged /usr, /etc/localtime): the
  // symlink is recreated as is, a directory or file is shown read-only.
  void system_path(const char* path, bool optional) {
    struct stat sb{};
    if (::lstat(path, &sb) != 0) {
      if (!optional) host_path(path, path, false, false);
      return;
    }
    if (S_ISLNK(sb.st_mode)) {
      char target[PATH_MAX];
      ssize_t n = ::readlink(path, target, sizeof target - 1);
      if (n > 0) {
        target[n] = '\0';
        // An absolute target outside what we show (resolv.conf pointing into
        // /run) would dangle: show the resolved file instead.
        if (target[0] == '/' && std::string(target).rfind("/usr/", 0) != 0) {
          char real[PATH_MAX];
          if (::realpath(path, real) != nullptr) host_path(real, path, false, optional);
        } else {
          symlink(target, path);
        }
      }
      return;
    }
    host_path(path, path, false, optional);
  }

  MountRequest& tmpfs(const std::string& sandbox_path, std::string options, std::uint32_t uid, std::uint32_t gid,
                      std::uint64_t attrs, Stage stage, MountRequest::Kind kind = MountRequest::kTmpfs) {
    MountRequest& r = attach(sandbox_path, true, false, stage, kind);
    r.options = std::move(options);
    r.uid = uid;
    r.gid = gid;
    r.attrs = attrs;
    return r;
  }
};

// A version-4 UUID in the kernel's boot_id text form.
std::string random_uuid() {
  std::string h = random_hex(16);
  h[12] = '4';
  h[16] = "89ab"[(h[16] - '0') & 3];
  return h.substr(0, 8) + "-" + h.substr(8, 4) + "-" + h.substr(12, 4) + "-" + h.substr(16, 4) + "-" + h.substr(20);
}

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
      {"/cmdline", ProcMask::kFile, "the host kernel's command line (boot parameters, host infrastructure)"},
      {"/irq", ProcMask::kReadOnly, "interrupt affinity of the host"},
      {"/kallsyms", ProcMask::kFile, "kernel symbol addresses (KASLR)"},
      {"/kcore", ProcMask::kFile, "an image of the kernel's memory"},
      {"/keys", ProcMask::kFile, "keys of the kernel keyring"},
      {"/latency_stats", ProcMask::kFile, "kernel latency statistics"},
      {"/sched_debug", ProcMask::kFile, "scheduler state of every host task"},
      {"/scsi", ProcMask::kDir, "SCSI device control"},
      {"/sys", ProcMask::kReadOnly, "kernel tunables (sysctl): read-only"},
      // After /sys: a bind inside the read-only /proc/sys.
      {"/sys/kernel/random/boot_id", ProcMask::kBootId,
       "the host's boot id, the same in every run: a random one per run instead, so runs cannot be linked"},
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

  // 2. /etc: generated stubs (no host accounts, no host names) plus copies of
  //    the few host files the loader and, with network, name resolution need.
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
  if (!spec.venv.empty()) b.host_path(spec.venv, std::string(kVenvPath), false, false);

  // 4. Writable scratch space, size-limited, charged to the run's memory
  //    cgroup; nothing written there is executable.
  const auto& lim = spec.limits;
  b.tmpfs("/tmp", "size=" + std::to_string(lim.tmp_bytes) + ",mode=1777,nr_inodes=16384", 0, 0,
          kRW | MOUNT_ATTR_NOEXEC, Stage::MountTmpfs);
  b.tmpfs(spec.workdir, "size=" + std::to_string(lim.work_bytes) + ",mode=0700,nr_inodes=16384", spec.sandbox_uid,
          spec.sandbox_gid, kRW | MOUNT_ATTR_NOEXEC, Stage::MountTmpfs);

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
  for (const BindMount* m : binds) b.host_path(m->source, m->target, m->writable, m->optional);

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
    // Masked directories get an empty directory of the root tmpfs. Both, and
    // the run's boot id, live in the root tmpfs, which ends up read-only.
    b.write_file("/.masked", "", 0444);
    b.mkdirs("/.masked-dir", 0555);
    std::string boot_id = in.boot_id.empty() ? random_uuid() : in.boot_id;
    b.write_file("/.boot_id", boot_id + "\n", 0444);
    const char* masked = st.keep(b.host("/.masked"));
    const char* masked_dir = st.keep(b.host("/.masked-dir"));
    const char* boot_id_file = st.keep(b.host("/.boot_id"));
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
        auto& r = b.add(m.kind == ProcMask::kDir ? MountStep::kMaskDir : MountStep::kMaskFile, Stage::MaskProc);
        r.dst = st.keep(path);
        r.src = m.kind == ProcMask::kDir ? masked_dir : m.kind == ProcMask::kBootId ? boot_id_file : masked;
      }
    }
  }

  // 7. A minimal /dev: a tmpfs the parent fills with five character devices
  //    (a user namespace cannot mknod; binding them from the host's devtmpfs
  //    would show its size, half the host's memory, in mountinfo), the
  //    /proc/self/fd links and shm/; read-only, so the only writable place
  //    in it is the small /dev/shm.
  b.tmpfs("/dev", "size=64k,mode=0755,nr_inodes=64", 0, 0, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC,
          Stage::MountDev, MountRequest::kDev);
  st.made_dirs.insert("/dev/shm");
  b.tmpfs("/dev/shm", "size=" + std::to_string(std::min<std::uint64_t>(lim.tmp_bytes, 64ull << 20)) + ",mode=1777", 0,
          0, kRW | MOUNT_ATTR_NOEXEC, Stage::MountDev);

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

  // The root tmpfs: the skeleton, the generated /etc files and the copies.
  st.root = MountRequest{};
  st.root.kind = MountRequest::kTmpfs;
  st.root.options = "size=" + std::to_string(in.root_tmpfs_bytes + b.copied_bytes) + ",mode=0755,nr_inodes=4096";
  st.root.attrs = kRW;
  plan.root = st.keep(in.staging_root);
  plan.root_fd = -1;
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
