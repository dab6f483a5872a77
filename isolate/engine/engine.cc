#include "isolate/engine/engine.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <pthread.h>
#include <linux/capability.h>
#include <linux/sched.h>
#include <sched.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <linux/magic.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>

#include "isolate/base/random.h"
#include "isolate/base/wire.h"
#include "isolate/engine/child.h"
#include "isolate/engine/mounts.h"
#include "isolate/engine/plan.h"

namespace tsb::isolate {
namespace {

constexpr std::uint32_t kIdsPerSlot = 65536;

// glibc 2.36's <sys/pidfd.h> lacks C linkage for C++; the raw call is simpler.
int pidfd_signal(int pidfd, int sig) { return static_cast<int>(::syscall(SYS_pidfd_send_signal, pidfd, sig, nullptr, 0)); }

// Through the engine's checked /proc only (open_proc_file, child.h).
Status write_proc(int proc, pid_t pid, const char* file, const std::string& data) {
  const std::string path = std::to_string(pid) + "/" + file;
  UniqueFd fd(open_proc_file(proc, path.c_str()));
  ssize_t n = -1;
  if (fd) do n = ::write(fd.get(), data.data(), data.size());
    while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(data.size())) return Error::from_errno(n < 0 ? errno : EIO, "writing /proc/" + path);
  return {};
}

Result<UniqueFd> open_init(const std::string& path) {
  if (path.empty() || path[0] != '/') return Error::invalid("the path of toolsandbox-init must be absolute: '" + path + "'");
  UniqueFd fd(::open(path.c_str(), O_PATH | O_CLOEXEC));
  if (!fd) return Error::from_errno("toolsandbox-init '" + path + "'");
  struct stat st{};
  if (::fstat(fd.get(), &st) != 0) return Error::from_errno("stat '" + path + "'");
  // It builds every sandbox and is its pid 1: it must be root's and not
  // writable by anyone else, or whoever can write it owns every sandbox.
  // Executable by others (the sandbox's uid runs it) but not readable: an
  // exec of a file its user cannot read is not dumpable from its first
  // instruction, while it still holds the sandbox's capabilities.
  if (!S_ISREG(st.st_mode) || st.st_uid != 0 || (st.st_mode & (S_IWGRP | S_IWOTH | S_IRGRP | S_IROTH)) ||
      !(st.st_mode & S_IXOTH))
    return Error::invalid("refusing '" + path + "': toolsandbox-init must be a regular file owned by root, "
                          "executable but not readable or writable by others (mode 0711)", EPERM);
  return fd;
}

// A memfd holding `data`: the run's plan, read by toolsandbox-init.
Result<UniqueFd> plan_memfd(const std::string& data) {
  UniqueFd fd(::memfd_create("toolsandbox-plan", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) return Error::from_errno("memfd_create");
  for (std::size_t off = 0; off < data.size();) {
    ssize_t n = ::write(fd.get(), data.data() + off, data.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error::from_errno("writing the plan");
    }
    off += static_cast<std::size_t>(n);
  }
  // Sealed: what init checks is what it uses (it maps the plan).
  if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    return Error::from_errno("sealing the plan");
  return fd;
}

struct Pipe {
  UniqueFd r, w;
};
Status make_pipe(Pipe& p, bool stream_socket) {
  int fds[2];
  if ((stream_socket ? ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) : ::pipe2(fds, O_CLOEXEC)) != 0)
    return Error::from_errno(stream_socket ? "socketpair" : "pipe2");
  p = Pipe{UniqueFd(fds[0]), UniqueFd(fds[1])};
  return {};
}
Status set_nonblock(int fd) {
  int fl = ::fcntl(fd, F_GETFL);
  if (fl < 0 || ::fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0) return Error::from_errno("fcntl O_NONBLOCK");
  return {};
}

// Start time of a process (clock ticks since boot, /proc/<pid>/stat field
// 22), 0 when there is no such process. A pid plus its start time names a
// process; a pid alone may name a later one.
std::uint64_t process_start_ticks(pid_t pid) {
  auto text = read_text_file("/proc/" + std::to_string(pid) + "/stat");
  if (!text.ok()) return 0;
  auto close = text->rfind(')');
  if (close == std::string::npos) return 0;
  // After "pid (comm)": field 3 is state; start time is field 22.
  std::size_t pos = close + 2;
  for (int field = 3; field < 22 && pos < text->size(); ++field) {
    pos = text->find(' ', pos);
    if (pos == std::string::npos) return 0;
    ++pos;
  }
  std::uint64_t v = 0;
  std::from_chars(text->data() + pos, text->data() + text->size(), v);
  return v;
}

// The uid-slot lock file holds one record per slot, at slot * sizeof; the
// OFD lock on a record is the lease. The record names the run's init
// (pid, start time): the init holds the lease too, and when its engine died
// the lock is released as init exits, a moment before the kernel has killed
// the rest of its namespace. A slot whose recorded init still exists (dying,
// or a zombie nobody reaped yet) is not free.
struct SlotRecord {
  std::uint32_t magic;
  std::int32_t pid;
  std::uint64_t start_ticks;
};
static_assert(sizeof(SlotRecord) == 16);
constexpr std::uint32_t kSlotMagic = 0x74736c31;  // "tsl1"

// Writes slot `slot`'s record; false (errno set) when it could not.
bool write_slot_record(int fd, std::uint32_t slot, const SlotRecord& rec) {
  return ::pwrite(fd, &rec, sizeof rec, static_cast<off_t>(slot) * static_cast<off_t>(sizeof rec)) ==
         static_cast<ssize_t>(sizeof rec);
}

}  // namespace

// ------------------------------------------------------------- EngineCore

// What outlives a Sandbox that was destroyed before its end, until the
// kernel is done with it: its pid 1 (to reap), its leaf (to remove), its
// uid-slot lease (to release only when both are gone).
struct Retired {
  UniqueFd pidfd;
  bool reaped = false;
  std::unique_ptr<CgroupLeaf> leaf;
  UniqueFd lease;
  std::uint32_t slot = 0;
};

// Locked: a Sandbox may be made on one thread (the spawner's spawn thread)
// and destroyed on another.
struct EngineCore {
  std::unique_ptr<Cgroups> cgroups;

  void retire(Retired r) {
    std::lock_guard lock(mu);
    retired.push_back(std::move(r));
  }

  std::size_t collect() {
    std::lock_guard lock(mu);
    for (auto it = retired.begin(); it != retired.end();) {
      if (!it->reaped && it->pidfd) {
        siginfo_t si{};
        if (::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(it->pidfd.get()), &si, WEXITED | WNOHANG) == 0) {
          if (si.si_pid != 0) it->reaped = true;
        } else if (errno == ECHILD) {
          it->reaped = true;  // reaped elsewhere
        }
      } else {
        it->reaped = true;
      }
      if (it->reaped && it->leaf) {
        auto done = it->leaf->try_remove();
        if (!done.ok() || *done) it->leaf.reset();  // removed, or not removable: the next start-up reclaims it
      }
      if (it->reaped && !it->leaf) {
        // Cleared, best effort: a record left behind only costs the next
        // lease one /proc lookup (its init is gone).
        if (it->lease) (void)write_slot_record(it->lease.get(), it->slot, SlotRecord{});
        it = retired.erase(it);
      } else {
        ++it;
      }
    }
    return retired.size();
  }

 private:
  std::mutex mu;
  std::vector<Retired> retired;
};

// ---------------------------------------------------------------- Sandbox

Sandbox::~Sandbox() {
  // Never blocks: what is left (an init to reap, a leaf to remove, with the
  // uid-slot lease, held until both are gone) goes to the engine, whose
  // owner collects it when it chooses (collect_retired: the spawner not
  // while its spawn thread may hold the kernel's cgroup lock).
  if (!core_) return;
  if (pidfd_ && !reaped_) kill();
  core_->retire(Retired{std::move(pidfd_), reaped_, std::move(leaf_), std::move(uid_slot_), slot_});
}

void Sandbox::kill() noexcept {
  // Killing pid 1 of the namespace kills every process in it, atomically
  // for forks in flight (the kernel stops pid allocation in the namespace
  // first). cgroup.kill (v2) or the freezer sweep (v1) is the second fence.
  if (pidfd_ && !reaped_) (void)pidfd_signal(pidfd_.get(), SIGKILL);
  if (leaf_) (void)leaf_->kill_all();
}

void Sandbox::cancel() noexcept {
  cancelled_ = true;
  kill();
}

Result<int> Sandbox::reap() {
  if (reaped_) return init_status_;
  siginfo_t si{};
  for (;;) {
    if (::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pidfd_.get()), &si, WEXITED) == 0) break;
    if (errno == EINTR) continue;
    return Error::from_errno("waitid on the sandbox's pid 1");
  }
  reaped_ = true;
  // The tool's own status arrives on the report pipe; pid 1's is kept only
  // for diagnostics, as a wait(2)-style status.
  init_status_ = si.si_code == CLD_EXITED ? W_EXITCODE(si.si_status, 0) : (si.si_status & 0x7f);
  return init_status_;
}

Result<bool> Sandbox::try_remove_cgroup() {
  if (!leaf_) return true;
  auto done = leaf_->try_remove();
  if (!done.ok()) {
    leaf_.reset();
    // context: the leaf's removal names the cgroup
    return std::move(done).error();
  }
  if (*done) leaf_.reset();
  return *done;
}

bool Sandbox::socket_memory_is_limited() const noexcept {
  return core_ && core_->cgroups->mode() == CgroupMode::V1 && core_->cgroups->has_tcp_memory_limit() &&
         limits_.memory_bytes > 0;
}

std::size_t Sandbox::collect_retired() { return core_ ? core_->collect() : 0; }

void Sandbox::read_reports(Observations& o) const {
  Report r;
  for (;;) {
    ssize_t n = ::read(report_r_.get(), &r, sizeof r);
    if (n < 0 && errno == EINTR) continue;
    if (n != static_cast<ssize_t>(sizeof r) || r.magic != kReportMagic) break;
    // The path of the step a report names: the table's, with no byte of a tool's.
    const std::string path = r.step >= 0 && static_cast<std::size_t>(r.step) < step_paths_.size() ? step_paths_[r.step] : "";
    if (r.kind == Report::kSetupError && !o.have_setup_error) {
      o.have_setup_error = true;
      o.setup_stage = r.stage;
      o.setup_errno = r.value;
      o.setup_path = path;
    } else if (r.kind == Report::kMovedAside && !path.empty() && o.moved_aside.size() < 64) {
      o.moved_aside.push_back(path + kAsideInfix + std::to_string(static_cast<unsigned>(r.value)));
    } else if (r.kind == Report::kToolStatus) {
      o.have_tool_status = true;
      o.tool_status = r.value;
    } else if (r.kind == Report::kBackstop) {
      o.backstop = true;
      o.backstop_s = r.value;
    } else if (r.kind == Report::kLandlock) {
      o.landlock = r.value;
    }
  }
}

// ----------------------------------------------------------------- Engine

Result<std::unique_ptr<Engine>> Engine::create(EngineConfig config, std::shared_ptr<const SeccompProgram> init_filter) {
  std::unique_ptr<Engine> e(new Engine());
  if (::geteuid() != 0)
    return Error::invalid("toolsandbox needs root: it creates namespaces, cgroups and id maps", EPERM);
  if (config.uid_base == 0 || config.uid_slots == 0 ||
      static_cast<std::uint64_t>(config.uid_base) + std::uint64_t{config.uid_slots} * kIdsPerSlot >= 0xFFFFFFFFull)
    return Error::invalid("uid range: uid_base must be > 0 and uid_base + uid_slots*65536 below 2^32-1");
  if (config.sandbox_oom_score_adj < -1000 || config.sandbox_oom_score_adj > 1000)
    return Error::invalid("sandbox_oom_score_adj must be between -1000 and 1000");

  // (That /proc is this pid namespace's, the engine names its children
  // by pid there, was checked by the set-up: daemon/compile/prepare.h, check_proc.)
  // What the engine writes there (id maps, OOM scores, vm.memfd_noexec)
  // goes through this one handle: the root of a procfs mount (its root
  // inode is 1), else no run starts (open_proc_file, child.h).
  e->proc_.reset(::open("/proc", O_PATH | O_DIRECTORY | O_CLOEXEC));
  struct statfs pfs{};
  struct stat pst{};
  if (!e->proc_ || ::fstatfs(e->proc_.get(), &pfs) != 0 || ::fstat(e->proc_.get(), &pst) != 0 ||
      pfs.f_type != PROC_SUPER_MAGIC || pst.st_ino != 1)
    return Error::invalid("/proc is not the root of a procfs mount: the engine writes id maps only there", EXDEV);

  // Sandboxes inherit the engine's supplementary groups and setgroups(2) is
  // denied inside them (so they cannot be dropped there): drop them here.
  if (::setgroups(0, nullptr) != 0) return Error::from_errno("setgroups(0)");

  // fds 0-2 must be open so no pipe the engine makes lands on them (the
  // child path relies on it when it dup2s the tool's stdio).
  for (int fd = 0; fd < 3; ++fd) {
    if (::fcntl(fd, F_GETFD) < 0) {
      int n = ::open("/dev/null", O_RDWR);
      if (n < 0) return Error::from_errno("open /dev/null");
      if (n != fd) return Error::invalid("could not fill fds 0-2 with /dev/null", EBADF);
    }
  }
  // A tool that exits before reading its stdin must not kill the engine.
  ::signal(SIGPIPE, SIG_IGN);
  // Children must stay waitable (an ignored SIGCHLD auto-reaps them).
  struct sigaction sa{};
  if (::sigaction(SIGCHLD, nullptr, &sa) == 0 && sa.sa_handler == SIG_IGN) ::signal(SIGCHLD, SIG_DFL);

  // The state directory, prepared by the caller (daemon/compile/prepare.h).
  e->staging_root_ = config.state_dir + "/root";
  e->slot_lock_path_ = config.state_dir + "/uid-slots.lock";
  e->engines_dir_ = config.state_dir + "/engines";
  const std::string empty = config.state_dir + "/empty";  // the overlays' lowest layer
  e->empty_dir_.reset(::open(empty.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!e->empty_dir_) return Error::from_errno("state directory: open '" + empty + "'");

  // This engine's tag and its lock: held for the engine's whole life, it is
  // what says "alive" to the start-up reclaim of another engine, whatever
  // pid either of them has (a container restart gives the daemon its old
  // pid every time).
  e->instance_ = random_hex(4);
  {
    // Locked before it has a name: no one can see it unlocked (and take
    // this engine for a dead one).
    const std::string lock = e->engines_dir_ + "/" + e->instance_ + ".lock";
    e->instance_lock_.reset(::open(e->engines_dir_.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600));
    if (!e->instance_lock_ || ::flock(e->instance_lock_.get(), LOCK_EX | LOCK_NB) != 0 ||
        ::linkat(e->proc_.get(), ("self/fd/" + std::to_string(e->instance_lock_.get())).c_str(), AT_FDCWD,
                 lock.c_str(), AT_SYMLINK_FOLLOW) != 0)
      return Error::from_errno("creating '" + lock + "'");
  }

  auto cg = Cgroups::open(config.cgroups);
  if (!cg.ok()) return std::move(cg).error().wrap("setting up cgroups");
  e->core_ = std::make_shared<EngineCore>();
  e->core_->cgroups = std::move(cg).value();
  e->config_ = config;
  e->reclaim_at_start();

  auto init = open_init(config.init_path);
  if (!init.ok()) return std::move(init).error().wrap("toolsandbox-init");
  e->init_exe_ = std::move(init).value();

  // Compiled by the caller (daemon/policy/seccomp_profile.h,
  // compile_init_filter): the engine loads programs, it never reads rules.
  if (!init_filter || init_filter->insns.empty()) return Error::invalid("the sandbox init's seccomp program is missing");
  e->init_filter_.assign(reinterpret_cast<const char*>(init_filter->insns.data()),
                         init_filter->insns.size() * sizeof(sock_filter));

  // Kernel features. Each one that is missing is either fatal (the engine
  // was asked for it) or said at start-up, never silently dropped.
  e->features_.memfd_noexec = ::faccessat(e->proc_.get(), "sys/vm/memfd_noexec", F_OK, 0) == 0;
  if (!e->features_.memfd_noexec)
    e->startup_notes_.push_back(
        "this kernel has no vm.memfd_noexec (Linux 6.3+): a tool can execute a binary it writes to a memfd; "
        "policies that must refuse it drop memfd_create from their seccomp profile");
  // Landlock's ABI (0: none): the init applies what it allows to every run.
  const long abi = ::syscall(SYS_landlock_create_ruleset, nullptr, 0, 1u /* LANDLOCK_CREATE_RULESET_VERSION */);
  // As init decides per run: only "not built in" or "turned off at boot"
  // means no Landlock; any other refusal (an outer seccomp filter) would
  // fail every run at stage landlock, so it fails here, once.
  if (config.landlock && abi < 0 && errno != ENOSYS && errno != EOPNOTSUPP)
    return Error::from_errno("probing Landlock (engine.landlock \"off\" runs without it)");
  e->features_.landlock_abi = !config.landlock ? -1 : abi > 0 ? static_cast<int>(abi) : 0;
  if (config.landlock && abi <= 0)
    e->startup_notes_.push_back("this kernel has no Landlock (" + std::string(std::strerror(errno)) +
                                "): runs have no second wall behind their mounts (docs/SECURITY.md, \"Landlock\")");
  e->features_.tcp_memory_limit =
      e->core_->cgroups->mode() == CgroupMode::V2 || e->core_->cgroups->has_tcp_memory_limit();
  if (!e->features_.tcp_memory_limit)
    e->startup_notes_.push_back("cgroup v1 without memory.kmem.tcp.limit_in_bytes: socket buffers of runs are not "
                                "charged to their memory limit");
  // With CAP_SYS_RESOURCE the engine's write of a run's oom_score_adj is
  // also its floor (no process of the run can go below it); without it the
  // score is only a start value.
  {
    struct __user_cap_header_struct hdr {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2] = {};
    if (::syscall(SYS_capget, &hdr, data) == 0)
      e->features_.oom_score_floor = (data[CAP_SYS_RESOURCE / 32].effective >> (CAP_SYS_RESOURCE % 32)) & 1u;
    if (!e->features_.oom_score_floor)
      e->startup_notes_.push_back("no CAP_SYS_RESOURCE: runs start with oom_score_adj " +
                                  std::to_string(config.sandbox_oom_score_adj) +
                                  " but a run can lower it (to the engine's own score)");
  }
  if (config.hide_host_paths) {
    if (auto st = probe_overlay_views(e->empty_dir_.get()); !st.ok())
      return std::move(st).error().wrap(
          "read-only views of host directories need overlayfs (modprobe overlay), so that no host path shows in a "
          "sandbox's mountinfo; set engine.hide_host_paths to false to bind them directly");
    e->features_.overlay_views = true;
  }
  return e;
}

Engine::~Engine() {
  if (core_) (void)drain_retired(std::chrono::seconds(2));
  if (instance_lock_) ::unlink((engines_dir_ + "/" + instance_ + ".lock").c_str());
}

Cgroups& Engine::cgroups() noexcept { return *core_->cgroups; }

std::size_t Engine::collect_retired() { return core_->collect(); }

std::size_t Engine::drain_retired(std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (int round = 0;; ++round) {
    std::size_t left = core_->collect();
    if (left == 0 || std::chrono::steady_clock::now() >= deadline) return left;
    std::this_thread::sleep_for(std::chrono::milliseconds(round < 20 ? 1 : 10));
  }
}

void Engine::reclaim_at_start() {
  // Leaves of engines that are gone (found by the caller: daemon/compile/prepare.h):
  // killed now, removed by the pending clean-up once the killed have exited,
  // without holding up the start.
  std::string names;
  for (const auto& name : config_.stale_leaves) {
    auto leaf = core_->cgroups->existing_leaf(name);
    if (!leaf || name.rfind(config_.leaf_prefix + ".", 0) != 0) continue;
    (void)leaf->kill_all();
    names += (names.empty() ? "" : ", ") + name;
    core_->retire(Retired{UniqueFd(), true, std::move(leaf), UniqueFd(), 0});
  }
  if (!names.empty())
    startup_notes_.push_back("reclaiming " + std::to_string(config_.stale_leaves.size()) +
                             " cgroup leaves of engines that are gone (their processes killed): " + names);
}

Result<UniqueFd> Engine::lease_uid_slot(std::uint32_t* slot) {
  // One open file description per lease; an OFD lock on record k is slot k.
  // The kernel drops the lock when the last descriptor of the description
  // is closed, including when a process dies, so a crash cannot leak slots;
  // the run's init holds a descriptor too (so the lease lasts as long as the
  // sandbox, even when the engine is gone), and the command line and the
  // daemon on one host never share host uids.
  UniqueFd fd(::open(slot_lock_path_.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd) return Error::from_errno("open '" + slot_lock_path_ + "'");
  for (std::uint32_t i = 0; i < config_.uid_slots; ++i) {
    std::uint32_t k = (next_slot_ + i) % config_.uid_slots;
    struct flock fl{};
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = static_cast<off_t>(k) * static_cast<off_t>(sizeof(SlotRecord));
    fl.l_len = sizeof(SlotRecord);
    if (::fcntl(fd.get(), F_OFD_SETLK, &fl) != 0) {
      if (errno != EAGAIN && errno != EACCES) return Error::from_errno("locking uid slot");
      continue;
    }
    SlotRecord rec{};
    if (::pread(fd.get(), &rec, sizeof rec, fl.l_start) == static_cast<ssize_t>(sizeof rec) && rec.magic == kSlotMagic &&
        rec.pid > 0 && process_start_ticks(rec.pid) == rec.start_ticks) {
      // The last run of this slot is still being torn down (its engine died).
      fl.l_type = F_UNLCK;
      (void)::fcntl(fd.get(), F_OFD_SETLK, &fl);
      continue;
    }
    *slot = k;
    next_slot_ = k + 1;
    return fd;
  }
  return Error::invalid("all " + std::to_string(config_.uid_slots) + " uid slots are in use", EBUSY);
}

// One spawn on its way: what its steps make, in the order Engine::spawn
// takes them, until the Sandbox owns it all. When a step fails, what is
// here goes with the Launch: the pipes, the mounts and the plan are
// closed, and the Sandbox, destroyed last, releases the uid slot and the
// leaf and kills the child once there is one.
struct Engine::Launch {
  Launch(Engine& e, const RunSpec& s) : engine(e), spec(s) {}
  Engine& engine;
  const RunSpec& spec;
  std::unique_ptr<Sandbox> sb;
  Pipe in, out, err, rep, sync, watch;
  UniqueFd egress_init;   // init's end of the egress socket pair
  PreparedFs fs;
  UniqueFd plan;
  std::vector<int> keep;  // what init gets across its execve: the descriptors the plan names
  std::vector<UniqueFd> join;  // v1: the leaf's `tasks` files, for the child (closed after the clone)

  // The Sandbox, with the run's uid slot and its cgroup leaf.
  Status reserve() {
    sb.reset(new Sandbox());
    sb->core_ = engine.core_;
    sb->started_ = std::chrono::steady_clock::now();
    sb->run_id_ = random_hex(8);
    sb->limits_ = spec.limits;
    // The engine's own state (the next slot, the leaf counter) is shared by
    // spawns on several threads.
    std::lock_guard lock(engine.reserve_mu_);
    auto lease = engine.lease_uid_slot(&sb->slot_);
    if (!lease.ok()) return std::move(lease).error().wrap("a uid slot");
    sb->uid_slot_ = std::move(lease).value();
    sb->host_uid_ = engine.config_.uid_base + sb->slot_ * kIdsPerSlot;
    // "<prefix>.<pid>.<instance>-<n>": the instance tag names this engine
    // (its lock file says whether it is alive); the pid is for people, and
    // for engines without a lock file.
    const std::string name = engine.config_.leaf_prefix + "." + std::to_string(::getpid()) + "." + engine.instance_ +
                             "-" + std::to_string(++engine.seq_);
    const CgroupLimits limits{spec.limits.memory_bytes, spec.limits.pids, spec.limits.cpu_quota_millicpus};
    auto leaf = engine.core_->cgroups->create_leaf(name, limits);
    if (!leaf.ok()) return std::move(leaf).error().wrap("creating the run's cgroup");
    sb->leaf_ = std::move(leaf).value();
    auto join_fds = sb->leaf_->join_fds();
    if (!join_fds.ok()) return std::move(join_fds).error().wrap("cgroup v1: the run's leaf");
    join = std::move(join_fds).value();
    return {};
  }

  // The run's pipes (the child's ends go to init, the parent's to the
  // Sandbox), non-blocking where the supervisor polls them. Egress: init
  // sends the proxy's listener it made in the sandbox's network namespace
  // over a socket pair, to the front end (isolate/engine/plan.h).
  Status make_pipes() {
    for (Pipe* p : {&in, &out, &err, &rep, &sync, &watch})
      TSB_TRY(make_pipe(*p, p == &in && spec.stdin_socket), "creating pipes");
    for (int fd : {in.w.get(), out.r.get(), err.r.get(), rep.r.get()}) TSB_TRY(set_nonblock(fd), "the run's pipes");
    int egress[2] = {-1, -1};
    if (spec.network == NetworkMode::Egress && ::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, egress) != 0)
      return Error::from_errno("the egress socket pair");
    egress_init.reset(egress[1]);
    sb->egress_.reset(egress[0]);
    return {};
  }

  // The sandbox's mounts, made here as detached mounts (isolate/engine/mounts.h),
  // owned by the slot's host ids.
  Status prepare_mounts() {
    auto made = prepare_fs(*spec.fs, {.host_id_base = sb->host_uid_, .tool_uid = spec.sandbox_uid,
                                      .tool_gid = spec.sandbox_gid, .overlay_views = engine.features_.overlay_views,
                                      .empty_dir_fd = engine.empty_dir_.get()});
    if (!made.ok()) return std::move(made).error().wrap("preparing the sandbox's mounts");
    fs = std::move(made).value();
    sb->step_paths_ = std::move(fs.paths);
    return {};
  }

  // The plan (isolate/engine/plan.h), sealed in a memfd: the descriptors
  // above, then the rest in the plan's order. The engine ends the run at
  // its wall timeout; init's own fence comes later, for an engine alive but
  // stuck.
  Status write_plan() {
    const auto wall = std::chrono::duration_cast<std::chrono::milliseconds>(spec.limits.wall_timeout);
    const auto slack = std::max<std::chrono::milliseconds>(std::chrono::seconds(5), wall / 10);
    const Limits& l = spec.limits;
    keep = {rep.w.get(), in.r.get(), out.w.get(), err.w.get(), sync.r.get(), watch.r.get(), sb->uid_slot_.get(),
            fs.root.get()};
    Writer w;
    w.u32(kPlanMagic);
    for (int fd : keep) w.i32(fd);
    w.i32(egress_init.get());
    w.u32(static_cast<std::uint32_t>((wall + slack).count() / 1000 + 1));
    w.u8(spec.network == NetworkMode::Host ? kNetworkHost : !egress_init ? kNetworkOwn : kNetworkEgress);
    w.u8(engine.config_.landlock ? kLandlockAuto : 0);
    w.u8(spec.end_note ? 1 : 0);
    w.cstr(engine.staging_root_);
    w.cstr(spec.hostname);
    w.cstr(spec.workdir);
    for (std::uint32_t id : {spec.sandbox_uid, spec.sandbox_gid}) w.u32(id);
    for (std::uint64_t v : {l.file_size_bytes, l.open_files, l.pids, static_cast<std::uint64_t>(l.cpu_time.count())})
      w.u64(v);
    for (const auto* list : {&spec.argv, &spec.env}) {
      w.u32(static_cast<std::uint32_t>(list->size()));
      for (const auto& a : *list) w.cstr(a);
    }
    w.cstr({reinterpret_cast<const char*>(spec.seccomp->insns.data()), spec.seccomp->insns.size() * sizeof(sock_filter)});
    w.cstr(engine.init_filter_);
    w.u32(fs.nsteps);
    w.raw(fs.steps);
    auto made = plan_memfd(w.take());
    if (!made.ok()) return std::move(made).error().wrap("init's plan");
    plan = std::move(made).value();
    keep.push_back(plan.get());
    for (const auto& fd : fs.fds) keep.push_back(fd.get());
    if (egress_init) keep.push_back(egress_init.get());
    return {};
  }

  // clone3 into new namespaces; on v2 the child is born in its leaf
  // (CLONE_INTO_CGROUP), on v1 it moves itself in first thing (join_fds):
  // either way no migration by the parent, whose global lock waits an RCU
  // grace period (~10 ms after quiet; docs/BENCHMARKS.md). Every signal is
  // blocked across clone3, and
  // CLONE_CLEAR_SIGHAND gives the child default handlers: no handler of
  // the engine can ever run in the child, which then resets its mask and
  // dispositions itself (systemd's safe_fork_full does the same around
  // fork).
  Status clone_child() {
    ChildStart start{.sync_fd = sync.r.get(), .sync_w_fd = sync.w.get(), .report_fd = rep.w.get(),
                     .init_fd = engine.init_exe_.get(), .proc_fd = engine.proc_.get(), .keep = keep.data(), .nkeep = keep.size(),
                     .join = join.data(), .njoin = join.size(),
                     .memfd_noexec = engine.features_.memfd_noexec, .report_arg = {}, .plan_arg = {}};
    std::snprintf(start.report_arg, sizeof start.report_arg, "%d", rep.w.get());
    std::snprintf(start.plan_arg, sizeof start.plan_arg, "%d", plan.get());
    const bool into_cgroup = engine.core_->cgroups->mode() == CgroupMode::V2;
    int pidfd = -1;
    struct clone_args args{};
    args.flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_PIDFD |
                 CLONE_CLEAR_SIGHAND | (spec.network != NetworkMode::Host ? CLONE_NEWNET : 0) |
                 (into_cgroup ? CLONE_INTO_CGROUP : 0);
    args.pidfd = reinterpret_cast<std::uint64_t>(&pidfd);
    args.exit_signal = SIGCHLD;
    if (into_cgroup) args.cgroup = static_cast<std::uint64_t>(sb->leaf_->clone_fd());
    sigset_t all, old;
    sigfillset(&all);
    ::pthread_sigmask(SIG_SETMASK, &all, &old);
    long pid = ::syscall(SYS_clone3, &args, sizeof args);
    if (pid == 0) child_main(start);  // never returns
    int clone_errno = errno;
    ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
    join.clear();
    if (pid < 0) return Error::from_errno(clone_errno, "clone3");
    sb->pid_ = static_cast<pid_t>(pid);
    sb->pidfd_.reset(pidfd);
    return {};
  }

  // The parent's ends: the child's closed here (init has them), the watch
  // pipe's kept by the Sandbox (init ends the run when it closes), the
  // slot's record names this run's init (see lease_uid_slot), and the
  // pipes to the tool are the supervisor's from here on, whatever happens
  // below.
  Status take_parent_ends() {
    for (UniqueFd* fd : {&in.r, &out.w, &err.w, &rep.w, &sync.r, &watch.r}) fd->reset();
    sb->watch_w_ = std::move(watch.w);
    if (!write_slot_record(sb->uid_slot_.get(), sb->slot_, {kSlotMagic, sb->pid_, process_start_ticks(sb->pid_)}))
      return Error::from_errno("recording the uid slot's init");
    sb->stdin_w_ = std::move(in.w);
    sb->stdout_r_ = std::move(out.r);
    sb->stderr_r_ = std::move(err.r);
    sb->report_r_ = std::move(rep.r);
    return {};
  }

  // The child waits on the sync pipe until its OOM score and id maps are
  // written (kSyncMaps); init, until it sits in its leaf (kSyncCgroup).
  Status release_child() {
    // The sandbox is what the OOM killer takes first when memory runs out.
    // Written by the engine, which holds CAP_SYS_RESOURCE: that also makes it
    // the floor (oom_score_adj_min) for every process of the run, none of
    // which may then lower its score. Written from inside, it would not be.
    TSB_TRY(write_proc(engine.proc_.get(), sb->pid_, "oom_score_adj", std::to_string(engine.config_.sandbox_oom_score_adj)),
            "setting the run's OOM score");
    // Id maps: sandbox 0..65535 -> host range of this slot. setgroups first
    // ("deny" is required before an unprivileged gid_map and keeps the tool
    // from ever changing its groups).
    const std::string map = "0 " + std::to_string(sb->host_uid_) + " " + std::to_string(kIdsPerSlot) + "\n";
    TSB_TRY(write_proc(engine.proc_.get(), sb->pid_, "setgroups", "deny"), "writing id maps");
    TSB_TRY(write_proc(engine.proc_.get(), sb->pid_, "uid_map", map), "writing id maps");
    TSB_TRY(write_proc(engine.proc_.get(), sb->pid_, "gid_map", map), "writing id maps");
    // Both bytes at once: kSyncMaps for the child, kSyncCgroup for init (a
    // later image of the same process, which then roots its cgroup
    // namespace). The child sits in its leaf before it reads the first (v1:
    // it moved itself in; v2: born there).
    const char bytes[] = {kSyncMaps, kSyncCgroup};
    ssize_t n;
    do n = ::write(sync.w.get(), bytes, sizeof bytes);
    while (n < 0 && errno == EINTR);
    if (n != static_cast<ssize_t>(sizeof bytes)) return unless_gone(Error::from_errno("signalling the sandbox"));
    return {};
  }

  // A child that failed early (a missing venv is found by its first mount
  // steps) has exited by the time the parent signals it: EPIPE on the sync
  // pipe, ESRCH writing its /proc files. That is not an engine
  // error: the child's own report says what failed, and supervise() reads
  // it. Returning the engine's "Broken pipe" instead hid the real cause.
  static Status unless_gone(Error e) { return e.code == EPIPE || e.code == ESRCH ? Status() : Status(std::move(e)); }
};

Result<std::unique_ptr<Sandbox>> Engine::spawn(const RunSpec& spec) {
  if (!spec.seccomp || spec.seccomp->insns.empty())
    return Error::invalid("a compiled seccomp program is required for every run");
  if (spec.sandbox_uid == 0 || spec.sandbox_uid >= 65534 || spec.sandbox_gid == 0 || spec.sandbox_gid >= 65534)
    return Error::invalid("the tool's uid and gid must be between 1 and 65533 (0 is the sandbox's init)");
  if (!spec.fs || spec.fs->empty()) return Error::invalid("a file-system table (daemon/policy/fs_table.h) is required for every run");
  if (spec.argv.empty() || spec.argv[0].empty()) return Error::invalid("no command to run");
  for (const auto& a : spec.argv)
    if (a.find('\0') != std::string::npos) return Error::invalid("an argument contains a NUL byte");
  for (const auto& e : spec.env)
    if (e.find('=') == std::string::npos || e[0] == '=' || e.find('\0') != std::string::npos)
      return Error::invalid("environment entries must be KEY=VALUE");
  (void)core_->collect();

  // The steps, in this order: each needs what the ones before made (the
  // slot's host ids for the mounts, every descriptor for the plan, the
  // child's pid for its maps). From the clone on, the Sandbox owns the
  // child: any early return kills it (and the engine reaps it later,
  // without blocking).
  Launch l(*this, spec);
  // 1. The Sandbox, its uid slot and its cgroup leaf.
  if (auto st = l.reserve(); !st.ok()) return std::move(st).error().wrap("reserving the sandbox");
  // 2. The run's pipes, and the egress socket pair.
  if (auto st = l.make_pipes(); !st.ok()) return std::move(st).error().wrap("the run's pipes");
  // 3. The mounts, detached.
  if (auto st = l.prepare_mounts(); !st.ok()) return std::move(st).error().wrap("preparing the mounts");
  // 4. init's plan, naming every descriptor above.
  if (auto st = l.write_plan(); !st.ok()) return std::move(st).error().wrap("writing init's plan");
  // 5. clone3: the child waits for its maps (child.cc), then executes init.
  if (auto st = l.clone_child(); !st.ok()) return std::move(st).error().wrap("starting the sandbox");
  // 6. The parent's ends of the pipes; the slot's record names the child.
  if (auto st = l.take_parent_ends(); !st.ok()) return std::move(st).error().wrap("the parent's pipe ends");
  // 7. OOM score, id maps, (v1) cgroup: the child goes on to build the sandbox.
  if (auto st = l.release_child(); !st.ok()) return std::move(st).error().wrap("releasing the sandbox");
  return std::move(l.sb);
}

}  // namespace tsb::isolate
