#include "isolate/engine.h"

#include <fcntl.h>
#include <grp.h>
#include <linux/sched.h>
#include <sched.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "isolate/child.h"
#include "isolate/hash.h"
#include "isolate/plan.h"

namespace tsb::isolate {
namespace {

constexpr std::uint32_t kIdsPerSlot = 65536;

// glibc 2.36's <sys/pidfd.h> lacks C linkage for C++; the raw call is simpler.
int pidfd_signal(int pidfd, int sig) { return static_cast<int>(::syscall(SYS_pidfd_send_signal, pidfd, sig, nullptr, 0)); }

Status write_proc(pid_t pid, const char* file, const std::string& data) {
  std::string path = "/proc/" + std::to_string(pid) + "/" + file;
  return write_text_file(path, data);
}

Result<std::string> self_dir() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n < 0) return Error::from_errno("readlink /proc/self/exe");
  buf[n] = '\0';
  std::string s(buf);
  return s.substr(0, s.rfind('/'));
}

Result<UniqueFd> open_init(const std::string& configured) {
  std::vector<std::string> candidates;
  if (!configured.empty()) {
    candidates.push_back(configured);
  } else {
    auto dir = self_dir();
    if (dir.ok()) candidates.push_back(*dir + "/toolsandbox-init");
    candidates.push_back(std::string(TSB_LIBEXECDIR) + "/toolsandbox-init");
  }
  std::string tried;
  for (const auto& c : candidates) {
    UniqueFd fd(::open(c.c_str(), O_PATH | O_CLOEXEC));
    if (!fd) {
      tried += (tried.empty() ? "" : ", ") + c;
      continue;
    }
    struct stat st{};
    if (::fstat(fd.get(), &st) != 0) return Error::from_errno("stat '" + c + "'");
    // It runs as pid 1 of every sandbox: it must be root's and not writable
    // by anyone else, or whoever can write it owns every sandbox.
    if (!S_ISREG(st.st_mode) || st.st_uid != 0 || (st.st_mode & (S_IWGRP | S_IWOTH)))
      return Error::invalid("refusing '" + c + "': toolsandbox-init must be a regular file owned by root and writable only by root", EPERM);
    if (!(st.st_mode & S_IXOTH))
      return Error::invalid("'" + c + "' must be executable by others (the sandbox's uid runs it)", EACCES);
    return fd;
  }
  return Error::invalid("toolsandbox-init not found (tried " + tried + ")", ENOENT);
}

Result<UniqueFd> sealed_memfd(const char* name, const void* data, std::size_t len) {
  UniqueFd fd(::memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) return Error::from_errno("memfd_create");
  const char* p = static_cast<const char*>(data);
  std::size_t left = len;
  while (left > 0) {
    ssize_t n = ::write(fd.get(), p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error::from_errno("write memfd");
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  // Sealed: no run can alter the program the next run's init loads.
  if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    return Error::from_errno("sealing memfd");
  return fd;
}

struct Pipe {
  UniqueFd r, w;
};
Result<Pipe> make_pipe() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return Error::from_errno("pipe2");
  return Pipe{UniqueFd(fds[0]), UniqueFd(fds[1])};
}
Status set_nonblock(int fd) {
  int fl = ::fcntl(fd, F_GETFL);
  if (fl < 0 || ::fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0) return Error::from_errno("fcntl O_NONBLOCK");
  return {};
}

}  // namespace

// ---------------------------------------------------------------- Sandbox

Sandbox::~Sandbox() {
  if (pidfd_ && !reaped_) {
    kill();
    (void)reap();
  }
  if (leaf_) (void)leaf_->destroy();
}

void Sandbox::kill() noexcept {
  // Killing pid 1 of the namespace kills every process in it, atomically
  // for forks in flight (the kernel stops pid allocation in the namespace
  // first). cgroup.kill (v2) or the freezer sweep (v1) is the second fence.
  if (pidfd_ && !reaped_) (void)pidfd_signal(pidfd_.get(), SIGKILL);
  if (leaf_) (void)leaf_->kill_all();
}

void Sandbox::terminate() noexcept {
  if (pidfd_ && !reaped_) (void)pidfd_signal(pidfd_.get(), SIGTERM);
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

Status Sandbox::destroy_cgroup() {
  if (!leaf_) return {};
  auto st = leaf_->destroy();
  leaf_.reset();
  return st;
}

// ----------------------------------------------------------------- Engine

Result<std::unique_ptr<Engine>> Engine::create(EngineConfig config) {
  std::unique_ptr<Engine> e(new Engine());
  if (::geteuid() != 0)
    return Error::invalid("toolsandbox needs root: it creates namespaces, cgroups and id maps", EPERM);
  if (config.uid_base == 0 || config.uid_slots == 0 ||
      static_cast<std::uint64_t>(config.uid_base) + std::uint64_t{config.uid_slots} * kIdsPerSlot >= 0xFFFFFFFFull)
    return Error::invalid("uid range: uid_base must be > 0 and uid_base + uid_slots*65536 below 2^32-1");

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

  // State dir: traversable by the sandboxes' unprivileged ids (the child
  // resolves the staging path after it switched to them), writable by root only.
  // The modes are set with chmod, not left to mkdir: mkdir applies the
  // umask, and under a restrictive one (the systemd unit's UMask=0077, or a
  // root shell with umask 027) the directories came out without o+x and
  // every start failed the check below.
  auto make_dir = [](const std::string& p, mode_t mode) -> Status {
    if (::mkdir(p.c_str(), mode) == 0) {
      if (::chmod(p.c_str(), mode) != 0) return Error::from_errno("chmod '" + p + "'");
    } else if (errno != EEXIST) {
      return Error::from_errno("mkdir '" + p + "'");
    }
    return {};
  };
  TSB_TRY(make_dir(config.state_dir, 0711), "state directory");
  e->staging_root_ = config.state_dir + "/root";
  TSB_TRY(make_dir(e->staging_root_, 0755), "state directory");
  e->slot_lock_path_ = config.state_dir + "/uid-slots.lock";
  // The sandbox resolves the staging path after it switched to its mapped
  // ids, which are "others" for every host directory: each ancestor must be
  // searchable by others, or every run fails at mount-root with EACCES.
  for (std::string p = e->staging_root_; !p.empty() && p != "/"; p = p.substr(0, p.rfind('/'))) {
    struct stat st{};
    if (::stat(p.c_str(), &st) != 0) return Error::from_errno("stat '" + p + "'");
    if (!(st.st_mode & S_IXOTH))
      return Error::invalid("state directory: '" + p + "' must be searchable by others (chmod o+x): "
                            "sandboxes resolve '" + e->staging_root_ + "' with unprivileged ids", EACCES);
    if (p.rfind('/') == 0) break;
  }

  auto cg = Cgroups::open(config.cgroup_parent);
  if (!cg.ok()) return std::move(cg).error().wrap("setting up cgroups");
  e->cgroups_ = std::move(cg).value();
  (void)e->cgroups_->reclaim_stale(config.leaf_prefix);

  auto init = open_init(config.init_path);
  if (!init.ok()) return std::move(init).error();
  e->init_exe_ = std::move(init).value();

  auto filter = compile_init_filter();
  if (!filter.ok()) return std::move(filter).error().wrap("compiling the init filter");
  auto memfd = sealed_memfd("toolsandbox-init-filter", (*filter)->insns.data(),
                            (*filter)->insns.size() * sizeof(sock_filter));
  if (!memfd.ok()) return std::move(memfd).error();
  e->init_filter_ = std::move(memfd).value();

  e->instance_ = random_hex(4);
  e->empty_caps_ = ::cap_init();
  if (!e->empty_caps_) return Error::from_errno("cap_init");
  e->config_ = std::move(config);
  return e;
}

Engine::~Engine() {
  if (empty_caps_) ::cap_free(empty_caps_);
}

Result<UniqueFd> Engine::lease_uid_slot(std::uint32_t* slot) {
  // One open file description per lease; an OFD lock on byte k is slot k.
  // The kernel drops the lock when the description is closed, including
  // when the process dies, so a crash cannot leak slots, and the command
  // line and the daemon on one host never share host uids.
  UniqueFd fd(::open(slot_lock_path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!fd) return Error::from_errno("open '" + slot_lock_path_ + "'");
  for (std::uint32_t i = 0; i < config_.uid_slots; ++i) {
    std::uint32_t k = (next_slot_ + i) % config_.uid_slots;
    struct flock fl{};
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = k;
    fl.l_len = 1;
    if (::fcntl(fd.get(), F_OFD_SETLK, &fl) == 0) {
      *slot = k;
      next_slot_ = k + 1;
      return fd;
    }
    if (errno != EAGAIN && errno != EACCES) return Error::from_errno("locking uid slot");
  }
  return Error::invalid("all " + std::to_string(config_.uid_slots) + " uid slots are in use", EBUSY);
}

Result<std::unique_ptr<Sandbox>> Engine::spawn(const RunSpec& spec) {
  if (!spec.seccomp || spec.seccomp->insns.empty())
    return Error::invalid("a compiled seccomp program is required for every run");
  if (spec.sandbox_uid == 0 || spec.sandbox_uid >= 65534 || spec.sandbox_gid == 0 || spec.sandbox_gid >= 65534)
    return Error::invalid("the tool's uid and gid must be between 1 and 65533 (0 is the sandbox's init)");

  std::unique_ptr<Sandbox> sb(new Sandbox());
  sb->started_ = std::chrono::steady_clock::now();
  sb->run_id_ = random_hex(8);
  sb->limits_ = spec.limits;

  std::uint32_t slot = 0;
  auto lease = lease_uid_slot(&slot);
  if (!lease.ok()) return std::move(lease).error();
  sb->uid_slot_ = std::move(lease).value();
  sb->host_uid_ = config_.uid_base + slot * kIdsPerSlot;

  CgroupLimits cl;
  cl.memory_bytes = spec.limits.memory_bytes;
  cl.pids = spec.limits.pids;
  cl.cpu_quota_millicpus = spec.limits.cpu_quota_millicpus;
  // "<prefix>.<pid>.<instance>-<n>": the pid lets start-up reclaim leaves of
  // dead engines; the random instance tag keeps a new engine that got a
  // dead one's pid from colliding with its leftover leaves.
  std::string leaf_name = config_.leaf_prefix + "." + std::to_string(::getpid()) + "." + instance_ + "-" +
                          std::to_string(++seq_);
  auto leaf = cgroups_->create_leaf(leaf_name, cl);
  if (!leaf.ok()) return std::move(leaf).error().wrap("creating the run's cgroup");
  sb->leaf_ = std::move(leaf).value();

  auto in = make_pipe(), out = make_pipe(), err = make_pipe(), rep = make_pipe(), sync = make_pipe();
  for (auto* p : {&in, &out, &err, &rep, &sync})
    if (!p->ok()) return std::move(*p).error().wrap("creating pipes");
  TSB_TRY(set_nonblock(in->w.get()), "stdin pipe");
  TSB_TRY(set_nonblock(out->r.get()), "stdout pipe");
  TSB_TRY(set_nonblock(err->r.get()), "stderr pipe");
  TSB_TRY(set_nonblock(rep->r.get()), "report pipe");

  PlanStorage storage;
  ChildPlan plan{};
  PlanInputs inputs{&spec, staging_root_, config_.root_tmpfs_bytes};
  TSB_TRY(build_plan(inputs, storage, plan), "planning the sandbox");
  plan.sync_fd = sync->r.get();
  plan.report_fd = rep->w.get();
  plan.stdin_fd = in->r.get();
  plan.stdout_fd = out->w.get();
  plan.stderr_fd = err->w.get();
  plan.init_exe_fd = init_exe_.get();
  plan.init_filter_fd = init_filter_.get();
  plan.unshare_cgroupns = true;
  plan.filter = spec.seccomp->fprog();
  plan.empty_caps = empty_caps_;

  std::uint64_t flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_PIDFD;
  if (spec.network == NetworkMode::None) flags |= CLONE_NEWNET;
  const bool into_cgroup = cgroups_->mode() == CgroupMode::V2;
  if (into_cgroup) flags |= CLONE_INTO_CGROUP;

  int pidfd = -1;
  struct clone_args args{};
  args.flags = flags;
  args.pidfd = reinterpret_cast<std::uint64_t>(&pidfd);
  args.exit_signal = SIGCHLD;
  if (into_cgroup) args.cgroup = static_cast<std::uint64_t>(sb->leaf_->clone_fd());

  // On v2 the child is born in its leaf (CLONE_INTO_CGROUP): no migration,
  // which would cost milliseconds after idle (docs/BENCHMARKS.md).
  long pid = ::syscall(SYS_clone3, &args, sizeof args);
  if (pid == 0) child_sandbox_main(plan);  // never returns
  if (pid < 0) return Error::from_errno("clone3");

  // From here the Sandbox owns the child: any early return kills and reaps it.
  sb->pid_ = static_cast<pid_t>(pid);
  sb->pidfd_.reset(pidfd);
  in->r.reset();
  out->w.reset();
  err->w.reset();
  rep->w.reset();
  sync->r.reset();

  // Id maps: sandbox 0..65535 -> host range of this slot. setgroups first
  // ("deny" is required before an unprivileged gid_map and keeps the tool
  // from ever changing its groups).
  std::string map = "0 " + std::to_string(sb->host_uid_) + " " + std::to_string(kIdsPerSlot) + "\n";
  TSB_TRY(write_proc(sb->pid_, "setgroups", "deny"), "writing id maps");
  TSB_TRY(write_proc(sb->pid_, "uid_map", map), "writing id maps");
  TSB_TRY(write_proc(sb->pid_, "gid_map", map), "writing id maps");
  if (::write(sync->w.get(), &kSyncMaps, 1) != 1) return Error::from_errno("signalling the sandbox");

  // v1: migrate while the child builds its file system (the two overlap).
  if (!into_cgroup) TSB_TRY(sb->leaf_->attach_from_parent(sb->pid_), "cgroup v1");
  if (::write(sync->w.get(), &kSyncCgroup, 1) != 1) return Error::from_errno("signalling the sandbox");

  sb->stdin_w_ = std::move(in->w);
  sb->stdout_r_ = std::move(out->r);
  sb->stderr_r_ = std::move(err->r);
  sb->report_r_ = std::move(rep->r);
  return sb;
}

RunResult setup_failure_result(const Error& err) {
  RunResult r;
  r.reason = EndReason::SetupFailed;
  r.setup_errno = err.code;
  r.error = err.message;
  return r;
}

}  // namespace tsb::isolate
