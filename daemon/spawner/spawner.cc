#include "daemon/spawner/spawner.h"

#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <linux/securebits.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstring>

#include "isolate/base/file.h"


extern char** environ;

namespace tsb::spawn {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Names from the compiled set (root's files), in messages.
std::string q(std::string_view s) { return "'" + std::string(s) + "'"; }

// The spawner's environment minus what is the spawner's alone (systemd's
// notification socket and socket activation).
std::vector<char*> child_environment() {
  std::vector<char*> env;
  for (char** e = environ; e && *e; ++e) {
    std::string_view v(*e);
    if (v.starts_with("NOTIFY_SOCKET=") || v.starts_with("LISTEN_FDS=") || v.starts_with("LISTEN_PID=") ||
        v.starts_with("LISTEN_FDNAMES="))
      continue;
    env.push_back(*e);
  }
  env.push_back(nullptr);
  return env;
}

// Starts the front end's binary (the front end, or the compile helper) as
// a child that never outlives the spawner: default signals, a session of
// its own (no controlling terminal to push input into), stdin on /dev/null,
// `fds` (each {source, number}) as given and nothing else, no_new_privs.
// Run as root, it gives up every capability for good: as `uid` with no
// groups (the front end), or keeping uid 0 with securebits locked (the
// compile helper, so that the front end's user cannot trace it). Between
// fork and exec: async-signal-safe calls only; any failure ends the child
// (127).
Result<pid_t> launch(std::vector<std::string> args, const std::vector<std::pair<int, int>>& fds, uid_t uid,
                     gid_t gid) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  auto env = child_environment();
  int last = STDERR_FILENO;
  for (const auto& f : fds) last = std::max(last, f.second);
  if (fds.size() > 8) return Error::invalid("too many descriptors for a child");
  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) return Error::from_errno("fork");
  if (pid > 0) return pid;
  sigset_t none;
  sigemptyset(&none);
  if (::sigprocmask(SIG_SETMASK, &none, nullptr) != 0) ::_exit(127);
  ::signal(SIGPIPE, SIG_DFL);
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0 || ::getppid() != parent) ::_exit(127);
  // Each descriptor first copied above the targets, so no dup2 overwrites
  // one still to be placed.
  int high[8];
  for (std::size_t i = 0; i < fds.size(); ++i)
    if ((high[i] = ::fcntl(fds[i].first, F_DUPFD, last + 1)) < 0) ::_exit(127);
  for (std::size_t i = 0; i < fds.size(); ++i)
    if (::dup2(high[i], fds[i].second) != fds[i].second) ::_exit(127);
  int null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (null < 0 || ::dup2(null, STDIN_FILENO) != STDIN_FILENO) ::_exit(127);
  if (::close_range(static_cast<unsigned>(last) + 1, ~0U, 0) != 0 || ::setsid() < 0) ::_exit(127);
  if (::geteuid() == 0) {
    if (uid != 0 && (::setgroups(0, nullptr) != 0 || ::setresgid(gid, gid, gid) != 0)) ::_exit(127);
    // uid 0 with no way back to capabilities (execve of anything, a setuid
    // fixup), locked.
    const int bits = SECBIT_NOROOT | SECBIT_NOROOT_LOCKED | SECBIT_NO_SETUID_FIXUP | SECBIT_NO_SETUID_FIXUP_LOCKED |
                     SECBIT_KEEP_CAPS_LOCKED;
    if (uid == 0 && ::prctl(PR_SET_SECUREBITS, bits, 0, 0, 0) != 0) ::_exit(127);
    for (int c = 0; c <= 63; ++c)
      if (::prctl(PR_CAPBSET_DROP, c, 0, 0, 0) != 0 && errno != EINVAL) ::_exit(127);
    if (::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0) ::_exit(127);
    uid_t ru, eu, su;
    if (uid != 0 &&
        (::setresuid(uid, uid, uid) != 0 || ::getresuid(&ru, &eu, &su) != 0 || ru != uid || eu != uid || su != uid))
      ::_exit(127);
    // The uid change cleared the permitted and effective sets; every set is
    // cleared here, for both.
    __user_cap_header_struct h{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct d[2] = {};
    if (::syscall(SYS_capset, &h, d) != 0) ::_exit(127);
  }
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) ::_exit(127);
  // A uid change clears the death signal: set again.
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0 || ::getppid() != parent) ::_exit(127);
  ::execve(argv[0], argv.data(), env.data());
  ::_exit(127);
}

Result<int> wait_child(pid_t pid) {
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0)
    if (errno != EINTR) return Error::from_errno("waitpid");
  return st;
}

// Says why the spawner cannot go on; its exit status.
int critical(const std::string& message) {
  spdlog::critical("{}", message);
  return 1;
}

std::string describe_status(int st) {
  if (WIFEXITED(st)) return "exited with status " + std::to_string(WEXITSTATUS(st));
  if (WIFSIGNALED(st)) return std::string("was killed by signal ") + ::strsignal(WTERMSIG(st));
  return "ended (status " + std::to_string(st) + ")";
}

}  // namespace

Result<CompiledSet> compile_policies(const SpawnerOptions& o, bool optional, Compile what, UniqueFd* sources) {
  // The helper writes the compiled set (its stdout) and the record of the
  // files it read, which it seals, into memfds of this process's.
  UniqueFd set_fd(::memfd_create("toolsandboxd-set", MFD_CLOEXEC));
  UniqueFd record(::memfd_create("toolsandboxd-sources", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!set_fd || !record) return Error::from_errno("memfd_create (the compile helper's output)");
  std::vector<std::string> args = {o.front_end, what == Compile::kCheck ? "--check" : "--compile", "--config",
                                   o.config_path, "--sources-fd", "3"};
  if (optional) args.emplace_back("--config-optional");
  if (what == Compile::kSetup) args.emplace_back("--setup");
  auto launched = launch(std::move(args), {{set_fd.get(), STDOUT_FILENO}, {record.get(), 3}}, 0, 0);
  if (!launched.ok()) return std::move(launched).error().wrap("the compile helper");
  const pid_t pid = *launched;
  // Bounded: a helper stuck on a file system or a name lookup must not hold
  // the spawner (at a reload, its loop waits for this) for long. No signal
  // has a handler here: poll is not interrupted.
  UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  pollfd pfd{pidfd.get(), POLLIN, 0};
  const bool timed_out = !pidfd || ::poll(&pfd, 1, 30000) != 1;
  if (timed_out) ::kill(pid, SIGKILL);
  auto st = wait_child(pid);
  if (timed_out) return Error::invalid("the compile helper did not finish within 30 s, or could not be waited for (killed)", ETIMEDOUT);
  if (!st.ok()) return std::move(st).error().wrap("the compile helper");
  if (!WIFEXITED(*st) || WEXITSTATUS(*st) != 0)
    return Error::invalid("loading the configuration and policies failed (" + o.front_end + " " + describe_status(*st) +
                          "; its messages are above)");
  if (what == Compile::kCheck) return CompiledSet{};
  auto out = ::lseek(set_fd.get(), 0, SEEK_SET) == 0 ? read_opened_file(set_fd.get(), "the compiled set", {.max_bytes = 256u << 20})
                                                     : Error::from_errno("lseek (the compiled set)");
  if (!out.ok()) return std::move(out).error().wrap("the compile helper's output");
  *sources = std::move(record);
  return decode_compiled_set(*out);
}

Spawner::Spawner(SpawnerOptions opts, CompiledSet set, UniqueFd sources, std::unique_ptr<isolate::Engine> engine)
    : opts_(std::move(opts)), set_(std::move(set)), sources_(std::move(sources)), engine_(std::move(engine)) {}

Spawner::~Spawner() {
  // Only the socket we created, and only if the path still names it.
  struct stat st{};
  if (owns_socket_file_ && ::lstat(set_.socket_path.c_str(), &st) == 0 && st.st_dev == socket_dev_ &&
      st.st_ino == socket_ino_)
    ::unlink(set_.socket_path.c_str());
}

Status Spawner::open_listener() {
  int n = sd_listen_fds(1);
  if (n > 1) return Error::invalid("systemd passed " + std::to_string(n) + " sockets; toolsandboxd takes exactly one");
  if (n == 1) {
    if (sd_is_socket_unix(SD_LISTEN_FDS_START, SOCK_STREAM, 1, nullptr, 0) <= 0)
      return Error::invalid("the socket systemd passed is not a listening Unix stream socket");
    listener_.reset(::fcntl(SD_LISTEN_FDS_START, F_DUPFD_CLOEXEC, 3));
    if (!listener_) return Error::from_errno("adopting the systemd socket");
    ::close(SD_LISTEN_FDS_START);
    spdlog::info("listening on the socket passed by systemd");
    return {};
  }
  const std::string& path = set_.socket_path;
  std::string dir = path.substr(0, path.rfind('/'));
  if (!dir.empty() && ::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
    return Error::from_errno("mkdir '" + dir + "'");
  // Bound under a temporary name, given its owner and mode, listening, and
  // only then renamed into place (atomic): a client that finds the path can
  // connect at once, and the path never names a socket with other
  // permissions than configured.
  const std::string tmp = dir + "/.tsbd." + std::to_string(::getpid());
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  for (const std::string* p : {&path, &tmp})
    if (p->size() >= sizeof a.sun_path)
      return Error::invalid("socket path '" + *p + "' is longer than a Unix socket address allows (" +
                                std::to_string(sizeof a.sun_path - 1) + " bytes)",
                            ENAMETOOLONG);
  // A stale socket from a crashed instance is replaced, but only if nothing
  // answers on it (a second daemon must not steal the first's path).
  struct stat st{};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) return Error::invalid("'" + path + "' exists and is not a socket", EEXIST);
    UniqueFd probe(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
    if (probe && ::connect(probe.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0)
      return Error::invalid("another toolsandboxd is listening on '" + path + "'", EADDRINUSE);
  }
  ::unlink(tmp.c_str());  // our pid in the name: left by an earlier process with this pid
  listener_.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!listener_) return Error::from_errno("socket");
  std::memset(a.sun_path, 0, sizeof a.sun_path);
  std::memcpy(a.sun_path, tmp.c_str(), tmp.size() + 1);
  // Created with no access for anyone but root, then opened up.
  mode_t old = ::umask(0177);
  int b = ::bind(listener_.get(), reinterpret_cast<sockaddr*>(&a), sizeof a);
  ::umask(old);
  if (b != 0) return Error::from_errno("binding '" + tmp + "'");
  auto fail = [&](Error e) {
    ::unlink(tmp.c_str());
    return e;
  };
  if (::chown(tmp.c_str(), 0, set_.socket_gid) != 0) return fail(Error::from_errno("chown socket '" + tmp + "'"));
  if (::chmod(tmp.c_str(), set_.socket_mode) != 0) return fail(Error::from_errno("chmod socket '" + tmp + "'"));
  if (::listen(listener_.get(), SOMAXCONN) != 0) return fail(Error::from_errno("listen"));
  if (::rename(tmp.c_str(), path.c_str()) != 0) return fail(Error::from_errno("rename '" + tmp + "' to '" + path + "'"));
  if (::lstat(path.c_str(), &st) == 0) {
    owns_socket_file_ = true;
    socket_dev_ = st.st_dev;
    socket_ino_ = st.st_ino;
  }
  spdlog::info("listening on {}", path);
  return {};
}

UniqueFd Spawner::open_key_file() const {
  if (set_.e2b_key_file.empty()) return {};
  // Opened as root, read and checked by the front end (owner, mode, size):
  // the key is never in this process.
  UniqueFd fd(::open(set_.e2b_key_file.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY));
  if (!fd) spdlog::error("e2b: cannot open the API key file {}: {}", q(set_.e2b_key_file), std::strerror(errno));
  // Only a regular file goes to the front end: a descriptor of a device or
  // a socket opened as root would give it what its own user cannot open.
  struct stat st{};
  if (fd && (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode))) {
    spdlog::error("e2b: the API key file {} is not a regular file", q(set_.e2b_key_file));
    fd.reset();
  }
  return fd;
}

Status Spawner::start_front_end() {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) return Error::from_errno("socketpair");
  UniqueFd mine(sv[0]), theirs(sv[1]);
  // Room for the largest message (a run's environment): kMaxMessage with
  // CAP_NET_ADMIN (a spawner run by hand as root), else what
  // net.core.wmem_max allows (about 416 KiB by default, and under the
  // systemd unit, which grants no CAP_NET_ADMIN); the front end refuses a
  // run whose order does not fit, saying so.
  const int sz = static_cast<int>(kMaxMessage + 65536);
  for (int fd : {sv[0], sv[1]})
    for (auto [forced, plain] : {std::pair{SO_SNDBUFFORCE, SO_SNDBUF}, std::pair{SO_RCVBUFFORCE, SO_RCVBUF}})
      if (::setsockopt(fd, SOL_SOCKET, forced, &sz, sizeof sz) != 0 && ::setsockopt(fd, SOL_SOCKET, plain, &sz, sizeof sz) != 0)
        return Error::from_errno("sizing the front end's socket");
  UniqueFd key = open_key_file();
  std::vector<std::string> args = {opts_.front_end, "--serve",   "--config", opts_.config_path, "--listen-fd",
                                   "3",              "--control-fd", "4",      "--sources-fd",    "5"};
  if (key) args.insert(args.end(), {"--e2b-key-fd", "6"});
  const uid_t uid = set_.front_end_uid;
  std::vector<std::pair<int, int>> fds = {{listener_.get(), 3}, {theirs.get(), 4}, {sources_.get(), 5}};
  if (key) fds.emplace_back(key.get(), 6);
  auto launched = launch(std::move(args), fds, uid, set_.front_end_gid);
  if (!launched.ok()) return std::move(launched).error().wrap("the front end");
  const pid_t pid = *launched;
  UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  if (!pidfd) {
    ::kill(pid, SIGKILL);
    (void)wait_child(pid);
    return Error::from_errno("pidfd_open (front end)");
  }
  control_ = std::move(mine);
  fe_pidfd_ = std::move(pidfd);
  fe_pid_ = pid;
  fe_ready_ = false;
  spdlog::info("front end started: pid {} as {} (uid {})", pid, q(set_.front_end_user), uid);
  // The engine's facts, for the front end's status.
  send(encode(Hello{engine_->instance(), isolate::to_string(engine_->cgroups().mode()), engine_->cgroups().describe(),
                    engine_->features(), engine_->startup_notes()}));
  return {};
}

void Spawner::send(const std::string& msg, const int* fds, std::size_t nfds) {
  if (!control_) return;
  // Never blocking: a front end that leaves its socket full (megabytes of
  // answers unread) would stall every timer here. It is ended instead, and
  // its runs with it.
  auto st = send_message(control_.get(), msg, fds, nfds, MSG_DONTWAIT);
  if (st.ok()) return;
  if (st.error().code == EAGAIN && fe_pid_ > 0) {
    spdlog::error("the front end (pid {}) does not read its socket: ending it", fe_pid_);
    ::kill(fe_pid_, SIGKILL);
  } else {
    spdlog::warn("front end: {}", st.error().message);  // gone: its pidfd says so next
  }
  control_.reset();
}

void Spawner::refuse(std::uint64_t id, RefuseCode code, const std::string& why) {
  spdlog::warn("run request {} refused: {}", id, why);
  send(encode(Refused{id, code, why}));
}

const SpawnPolicy* Spawner::find_policy(const std::string& name, const std::string& fingerprint) const {
  // The set before the last reload only for a while: for orders prepared
  // under it and queued meanwhile, not as a way around the reload.
  const bool previous_valid = Clock::now() < previous_until_;
  for (const auto* list : {&set_.policies, &previous_}) {
    if (list == &previous_ && !previous_valid) break;
    for (const SpawnPolicy& p : *list)
      if (p.name == name && p.fingerprint == fingerprint) return &p;
  }
  return nullptr;
}

void Spawner::handle_run(const std::string& msg) {
  auto order = decode_run(msg);
  if (!order.ok()) {
    // Answered under its id when the message has one, so that the front end
    // is not left waiting.
    Reader r(msg);
    (void)r.u8();
    const std::uint64_t id = r.u64();
    refuse(r.ok() ? id : 0, RefuseCode::Malformed, order.error().message);
    return;
  }
  const RunOrder& o = *order;
  if (runs_.count(o.id)) return refuse(o.id, RefuseCode::Malformed, "run id " + std::to_string(o.id) + " is in use");
  if (stopping_) return refuse(o.id, RefuseCode::Unavailable, "the daemon is shutting down");
  const SpawnPolicy* p = find_policy(o.policy, o.fingerprint);
  // The refusals name nothing the front end sent (it knows what it sent):
  // this process logs no string it did not make.
  if (!p) return refuse(o.id, RefuseCode::UnknownPolicy, "no policy of that name with that fingerprint");
  if (!p->local) return refuse(o.id, RefuseCode::OutOfBounds, "policy '" + p->name + "' runs on E2B, not on this host");
  if (o.timeout.count() < 1 || o.timeout > p->limits.wall_timeout)
    return refuse(o.id, RefuseCode::OutOfBounds,
                  "timeout " + std::to_string(o.timeout.count()) + " ms is outside policy '" + p->name + "''s 1.." +
                      std::to_string(p->limits.wall_timeout.count()) + " ms");
  std::string bad;
  static constexpr const char* kEnvProblems[] = {"", "a name that is not a valid variable name",
                                                 "a variable the policy fixes", "a variable the policy does not allow",
                                                 "a value with a NUL byte"};
  if (auto problem = check_environment(p->env_set, p->env_allow, o.env, &bad); problem != EnvProblem::kOk)
    return refuse(o.id, RefuseCode::OutOfBounds,
                  std::string("environment: ") + kEnvProblems[static_cast<int>(problem)] + " (policy '" + p->name + "')");
  if (live_runs() >= set_.max_concurrent_runs)
    return refuse(o.id, RefuseCode::Busy, "max_concurrent_runs (" + std::to_string(set_.max_concurrent_runs) + ") reached");

  // A per-tool venv: a key of the cache the policy's venv row names (the
  // front end built it there), never a path.
  const auto& rows = *p->modes[static_cast<int>(o.mode)].fs;
  for (const std::string_view path : {isolate::kVenvPath, isolate::kNodeModulesPath}) {
    const std::string& key = path == isolate::kVenvPath ? o.venv : o.node_modules;  // TypeScript tools' in the same cache
    if (!key.empty() && (key.size() != 64 || key.find_first_not_of("0123456789abcdef") != std::string::npos ||
                         std::none_of(rows.begin(), rows.end(), [path](const isolate::FsEntry& e) { return e.keyed && e.path == path; })))
      return refuse(o.id, RefuseCode::OutOfBounds, "policy '" + p->name + "' takes no per-tool " + std::string(path.substr(1)) + " of that name");
  }
  if (p->modes[static_cast<int>(o.mode)].argv.empty())
    return refuse(o.id, RefuseCode::OutOfBounds, "the tool runner is not installed on this host");

  // A warm sandbox when there is a ready one still alive (the oldest
  // first); a run that finds none grows the pool by one, and so does one
  // that takes the last. Only the policy's own venv has pools.
  Live l;
  l.id = o.id;
  UniqueFd in, out, err, egress;
  if (Pool* pool = o.warm && o.venv.empty() && o.node_modules.empty() ? pool_for(*p, o.mode) : nullptr) {
    pool->last_run = Clock::now();
    for (auto it = pool->idle.begin(); it != pool->idle.end() && !l.sb;) {
      // Ended since the last turn: init's pidfd, or the runner's end of the
      // socket closed (the runner is gone, init not yet).
      pollfd ended[2] = {{it->sb->pidfd(), POLLIN, 0}, {it->in.get(), POLLRDHUP, 0}};
      if (!it->ready) {
        ++it;
      } else if (::poll(ended, 2, 0) != 0) {
        it = pool->idle.erase(it);
        lose(*pool, Clock::now());
      } else {
        // Full until now: how long it is short counts from here.
        if (pool->idle.size() >= pool->target) pool->full_at = Clock::now();
        l.sb = std::move(it->sb);
        in = std::move(it->in), out = std::move(it->out), err = std::move(it->err), egress = std::move(it->egress);
        pool->idle.erase(it);
        l.cpu_before = l.sb->cgroup().cpu_usage();
      }
    }
    ++(l.sb ? pool->hits : pool->misses);
    if (std::none_of(pool->idle.begin(), pool->idle.end(), [](const Pooled& w) { return w.ready; }))
      pool->target = std::min<std::uint32_t>(pool->target + 1, p->warm_max);
  }
  const bool warm = l.sb != nullptr;
  auto failed = [&](const Error& why) {  // a sandbox made is destroyed (killed)
    spdlog::error("spawn failed: {}", why.message);
    Ended e;
    e.id = o.id;
    e.observations.engine_error = why.message;
    e.observations.engine_errno = why.code;
    send(encode(e));
  };
  if (!warm) {
    isolate::RunSpec spec = run_spec_from(*p, o.mode, o.venv, false, o.node_modules);
    spec.limits.wall_timeout = o.timeout;
    spec.env = environment_of(p->env_set, o.env);
    auto spawned = engine_->spawn(spec);
    if (!spawned.ok()) return failed(spawned.error());
    l.sb = std::move(spawned).value();
    in = l.sb->take_stdin(), out = l.sb->take_stdout(), err = l.sb->take_stderr(), egress = l.sb->take_egress();
  } else {
    (void)::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, in.get(), nullptr);  // the front end's from now on
  }
  if (auto st = watch(*l.sb, l.sb->report_fd()); !st.ok()) return failed(st.error());
  const auto now = Clock::now();
  l.started = warm ? now : l.sb->started();
  l.wall_deadline = l.started + o.timeout;
  l.cpu_limited = l.sb->limits().cpu_time.count() > 0;
  l.next_cpu_check = now;
  l.socket_limited = l.sb->socket_memory_is_limited();
  const int fds[4] = {in.get(), out.get(), err.get(), egress.get()};  // network egress: the fourth
  send(encode(Started{o.id, l.sb->run_id(), l.sb->host_uid(), warm}), fds, egress ? 4 : 3);
  runs_.emplace(o.id, std::move(l));
}

Spawner::Pool* Spawner::pool_for(const SpawnPolicy& p, RunMode mode) {
  // Only the policies in force (not the set before a reload) have pools.
  const auto& ps = set_.policies;
  if (p.warm_max == 0 || p.modes[static_cast<int>(mode)].pooled_argv.empty() || &p < ps.data() ||
      &p >= ps.data() + ps.size())
    return nullptr;
  auto [it, made] = pools_.try_emplace(p.fingerprint + (mode == RunMode::Tool ? "/tool" : "/script"));
  Pool& pool = it->second;
  if (made) {
    pool.key = it->first;
    pool.policy = &p;
    pool.mode = mode;
    pool.target = p.warm_min;
    pool.last_run = Clock::now();
  }
  return &pool;
}

void Spawner::fill(Pool& pool) {
  const SpawnPolicy& p = *pool.policy;
  isolate::RunSpec spec = run_spec_from(p, pool.mode, "", /*pooled=*/true);
  // init's own backstop counts from the spawn: room for the longest wait
  // in the pool (idle: older ones are replaced) and then the longest run.
  spec.limits.wall_timeout = p.warm_idle + p.limits.wall_timeout;
  spec.env = environment_of(p.env_set, {});
  spawn_thread_->submit(pools_generation_, std::move(spec));
  filling_ = pool.key;
}

void Spawner::take_filled(Clock::time_point now) {
  auto done = spawn_thread_->take();
  if (!done) return;
  auto found = pools_.find(filling_);
  // Made for pools a reload or the stop ended: destroyed (killed) here.
  if (done->tag != pools_generation_ || found == pools_.end()) return;
  Pool& pool = found->second;
  // A spawn that failed, or a sandbox the epoll set cannot take (destroyed,
  // so killed, here): the pool pauses.
  Pooled w{++pooled_seq_};
  Status st = done->sandbox.ok() ? Status() : Status(std::move(done->sandbox).error().wrap("spawn failed"));
  if (st.ok()) {
    w.sb = std::move(done->sandbox).value();
    w.in = w.sb->take_stdin(), w.out = w.sb->take_stdout(), w.err = w.sb->take_stderr(), w.egress = w.sb->take_egress();
    st = watch(*w.sb, w.in.get());
  }
  if (!st.ok()) {
    spdlog::error("warm pool of policy {}: {}", q(pool.policy->name), st.error().message);
    ++pool.lost;
    pool.paused_until = now + std::chrono::seconds(10);
    return;
  }
  pool.idle.push_back(std::move(w));
}

void Spawner::end_pools() {
  pools_.clear();
  ++pools_generation_;
}

void Spawner::lose(Pool& pool, Clock::time_point now) {
  // A pool whose sandboxes keep ending before their use (a runner that
  // cannot start there) pauses for a minute.
  ++pool.lost;
  if (++pool.lost_in_a_row >= 3) {
    spdlog::error("warm pool of policy {}: 3 warm sandboxes in a row ended before their use; none made for 60 s",
                  q(pool.policy->name));
    pool.paused_until = now + std::chrono::seconds(60);
    pool.lost_in_a_row = 0;
  }
}

void Spawner::tend_pools(Clock::time_point now, bool quiet) {
  // Pools with a min exist from the start.
  for (const SpawnPolicy& p : set_.policies)
    for (RunMode m : {RunMode::Script, RunMode::Tool})
      if (p.warm_min > 0 && !stopping_) (void)pool_for(p, m);
  for (auto& [key, pool] : pools_) {
    const SpawnPolicy& p = *pool.policy;
    // One smaller for every idle period without a run, down to min; none
    // older than that period (init's backstop counts from its spawn).
    if (now - pool.last_run >= p.warm_idle && pool.target > p.warm_min) {
      --pool.target;
      pool.last_run = now;
    }
    // One that never became ready in kMaxStart is lost: it would hold every
    // refill back.
    std::erase_if(pool.idle, [&](const Pooled& w) {
      const auto age = now - w.sb->started();
      pool.lost += !w.ready && age >= kMaxStart;
      return age >= p.warm_idle || (!w.ready && age >= kMaxStart);
    });
    while (pool.idle.size() > pool.target) pool.idle.erase(pool.idle.begin());
    if (pool.idle.size() >= pool.target) pool.full_at = now;
  }
  if (!quiet) return;
  Clock::time_point due;
  if (Pool* pool = next_to_fill(now, due)) {
    fill(*pool);
    last_fill_ = now;
  }
}

Spawner::Pool* Spawner::next_to_fill(Clock::time_point now, Clock::time_point& due) {
  // The refill's budget: one sandbox starting at a time, made on a turn
  // with no message waiting (tend_pools), none while stopping, at most
  // max_concurrent_runs warm in all.
  const Clock::time_point never = due = Clock::time_point::max();
  const std::size_t live = live_runs();
  // Warm sandboxes hold uid slots too: never so many that runs lack one.
  const std::size_t room = std::min<std::size_t>(set_.max_concurrent_runs,
                                                 set_.engine.uid_slots - std::min(set_.engine.uid_slots, set_.max_concurrent_runs));
  if (spawn_thread_->busy()) return nullptr;  // its end wakes the loop
  std::size_t total = 0;
  for (const auto& [key, pool] : pools_) {
    total += pool.idle.size();
    for (const Pooled& w : pool.idle)
      if (!w.ready) return nullptr;  // its readiness (or loss) wakes the loop
  }
  if (stopping_ || total >= room) return nullptr;
  // A spawn (on the spawn thread) and the runner's start take CPU, and on
  // v1 a spawn holds the kernel's cgroup lock for a while: a refill waits
  // until no run is in flight and none began or ended for kRefillQuiet. A
  // pool short of its target for kRefillUnderLoad gets one anyway, at most
  // one every kRefillUnderLoad. Then the emptiest pool first.
  const Clock::time_point quiet = live == 0 ? last_activity_ + kRefillQuiet : never;
  Pool* next = nullptr;
  for (auto& [key, pool] : pools_) {
    const auto at = std::max({now, pool.paused_until,
                              std::min(quiet, std::max(pool.full_at, last_fill_) + kRefillUnderLoad)});
    if (pool.idle.size() < pool.target &&
        (at < due || (at == due && next && pool.target - pool.idle.size() > next->target - next->idle.size())))
      next = &pool, due = at;
  }
  return due <= now ? next : nullptr;
}

void Spawner::handle_message(const std::string& msg, std::vector<UniqueFd>& fds) {
  // The front end sends no descriptors. One that does is broken or hostile:
  // it is ended, and what it sent is closed without waiting (a socket with
  // a long SO_LINGER would otherwise hold this loop in close()).
  if (!fds.empty()) {
    const linger no_wait{1, 0};
    for (auto& fd : fds)  // on anything but a socket it fails (ENOTSOCK), changing nothing
      (void)::setsockopt(fd.get(), SOL_SOCKET, SO_LINGER, &no_wait, sizeof no_wait);
    fds.clear();
    spdlog::error("the front end (pid {}) sent descriptors: ending it", fe_pid_);
    if (fe_pid_ > 0) ::kill(fe_pid_, SIGKILL);
    control_.reset();
    return;
  }
  switch (message_type(msg)) {
    case Msg::Run: last_activity_ = Clock::now(); return handle_run(msg);
    case Msg::Kill: {
      auto k = decode_kill(msg);
      if (!k.ok()) return refuse(0, RefuseCode::Malformed, k.error().message);
      auto it = runs_.find(k->id);
      if (it != runs_.end() && !it->second.orphan) it->second.sb->cancel();  // else ended: its Ended is on the way
      return;
    }
    case Msg::Pools: {
      if (msg.size() != 1) return refuse(0, RefuseCode::Malformed, "malformed pools message");
      PoolState st;
      for (const auto& [key, pool] : pools_) {
        PoolState::Pool& e = st.pools.emplace_back();
        e.policy = pool.policy->name;
        e.mode = pool.mode;
        for (const Pooled& w : pool.idle) ++(w.ready ? e.ready : e.starting);
        e.target = pool.target;
        e.hits = pool.hits, e.misses = pool.misses, e.lost = pool.lost;
      }
      return send(encode(st));
    }
    case Msg::Notify: {
      auto n = decode_notify(msg);
      if (!n.ok()) return refuse(0, RefuseCode::Malformed, n.error().message);
      // Only that it is ready, with a status text of printable ASCII; never
      // MAINPID= or anything else that would change how systemd treats the
      // unit. RELOADING=1 and STOPPING=1 are the spawner's (it gets the
      // signals).
      std::string status = *n;
      for (char& c : status) c = c >= 0x20 && c < 0x7f ? c : '?';
      fe_ready_ = true;
      sd_notify(0, ("READY=1\n" + (status.empty() ? "" : "STATUS=" + status + "\n")).c_str());
      return;
    }
    default: return refuse(0, RefuseCode::Malformed, "unknown message type " + std::to_string(msg.empty() ? 0 : msg[0]));
  }
}

void Spawner::finish(Live& l) {
  isolate::Sandbox& sb = *l.sb;
  Ended e;
  e.id = l.id;
  e.wall = Clock::now() - l.started;
  pollfd exited{sb.pidfd(), POLLIN, 0};
  if (::poll(&exited, 1, 0) == 1) (void)sb.reap();  // else init is still exiting: reaped with the engine's clean-up
  e.run_id = sb.run_id();
  e.host_uid = sb.host_uid();
  sb.read_reports(l.obs);
  isolate::CgroupStats cs = sb.cgroup().stats();
  l.obs.oom_kills = cs.oom_kills;
  l.obs.pids_max_hits = cs.pids_max_hits;
  l.obs.socket_limit_reached = sb.cgroup().socket_limit_reached();
  l.obs.cancelled = sb.cancelled();
  e.warm_start_cpu = std::min(cs.cpu, l.cpu_before);
  e.cpu = cs.cpu - e.warm_start_cpu;
  e.peak_memory_bytes = cs.peak_memory_bytes;
  e.observations = std::move(l.obs);
  if (!l.orphan) send(encode(e));
  last_activity_ = Clock::now();
  // After the Ended (a removal takes the kernel's cgroup lock). One
  // attempt; a leaf still busy goes to the engine's pending clean-up with
  // the Sandbox.
  if (auto done = sb.try_remove_cgroup(); !done.ok()) spdlog::warn("run {}: {}", e.run_id, done.error().message);
}

void Spawner::check_limits(Clock::time_point now) {
  for (auto& [id, l] : runs_) {
    if (now >= l.wall_deadline && !l.obs.timed_out) {
      l.obs.timed_out = true;
      l.sb->kill();
    }
    if (l.cpu_limited && now >= l.next_cpu_check && !l.obs.cpu_exceeded) {
      // The earliest the budget can run out is what is left over the quota:
      // the next look is then, not a polling interval.
      const auto limit = std::chrono::duration_cast<std::chrono::nanoseconds>(l.sb->limits().cpu_time);
      const auto used = l.sb->cgroup().cpu_usage() - l.cpu_before;
      if (used >= limit) {
        l.obs.cpu_exceeded = true;
        l.sb->kill();
      } else {
        const double cpus = std::max(0.001, l.sb->limits().cpu_quota_millicpus / 1000.0);
        auto wait = std::chrono::nanoseconds(static_cast<long long>((limit - used).count() / cpus));
        l.next_cpu_check = now + std::max<std::chrono::nanoseconds>(wait, milliseconds(10));
      }
    }
    // cgroup v1 charges socket buffers apart from memory: at their limit
    // sends stall; such a run is ended (classify names it memory_limit).
    if (l.socket_limited && now >= next_socket_sweep_ && l.sb->cgroup().socket_limit_reached()) l.sb->kill();
  }
  // One sweep a second for every run: two cgroup files read per run (~20
  // us each, path walk included), so 500 runs hold the loop ~20 ms a sweep;
  // checked each on its own, every 100 ms, they woke it 5,000 times a
  // second and kept a CPU a quarter busy (docs/BENCHMARKS.md, density).
  if (now >= next_socket_sweep_) next_socket_sweep_ = now + milliseconds(1000);
}

milliseconds Spawner::poll_timeout(Clock::time_point now) {
  auto next = now + milliseconds(1000);  // retired leaves (and idle pools) are looked at at least this often
  Clock::time_point fill_at;
  (void)next_to_fill(now, fill_at);  // a refill due now: 0, on the next quiet turn
  next = std::min(next, fill_at);
  for (const auto& [id, l] : runs_) {
    if (!l.obs.timed_out) next = std::min(next, l.wall_deadline);
    if (l.cpu_limited && !l.obs.cpu_exceeded) next = std::min(next, l.next_cpu_check);
    if (l.socket_limited) next = std::min(next, next_socket_sweep_);
  }
  if (stopping_ && fe_pid_ > 0) next = std::min(next, stop_deadline_);
  auto ms = std::chrono::ceil<milliseconds>(next - now);
  return std::max(ms, milliseconds(0));
}

// The front end has exited: reaped, logged, its runs killed; then either
// another one is due at restart_at_ or the spawner stops.
void Spawner::front_end_gone(Clock::time_point now) {
  int st = 0;
  siginfo_t si{};
  if (::waitid(P_PIDFD, static_cast<id_t>(fe_pidfd_.get()), &si, WEXITED) == 0)
    st = si.si_code == CLD_EXITED ? (si.si_status << 8) : si.si_status;
  fe_exit_ = WIFEXITED(st) ? WEXITSTATUS(st) : 1;
  if (stopping_) spdlog::info("front end (pid {}) {}", fe_pid_, describe_status(st));
  else spdlog::error("front end (pid {}) {}", fe_pid_, describe_status(st));
  fe_pidfd_.reset();
  control_.reset();
  fe_pid_ = -1;
  // Its runs have no one to answer to: killed, and kept until pid 1 is
  // reaped (their uid slots and leaves are released then).
  std::map<std::uint64_t, Live> keep;
  for (auto& [id, l] : runs_) {
    l.sb->cancel();
    l.orphan = true;
    keep.emplace((1ull << 63) | orphan_seq_++, std::move(l));
  }
  runs_ = std::move(keep);
  if (!runs_.empty()) spdlog::warn("killed {} runs of the front end that ended", runs_.size());
  if (stopping_) return;
  // A front end that never became ready will not: a configuration it
  // cannot read, a missing user. So will the next one.
  if (!fe_ready_) {
    spdlog::critical("the front end ended before it was ready: stopping");
    stopping_ = true;
    fe_exit_ = fe_exit_ ? fe_exit_ : 1;
    return;
  }
  restarts_.push_back(now);
  std::erase_if(restarts_, [&](auto t) { return now - t > std::chrono::seconds(60); });
  if (restarts_.size() > 5) {
    spdlog::critical("the front end ended {} times in 60 s: stopping", restarts_.size());
    stopping_ = true;
    fe_exit_ = 1;
  } else {
    restart_at_ = now + milliseconds(restarts_.size() > 1 ? 1000 : 100);
    spdlog::warn("starting a new front end");
  }
}

void Spawner::reload() {
  spdlog::info("SIGHUP: reloading the configuration and policies");
  sd_notify(0, "RELOADING=1");  // READY=1 comes from the front end once it has followed
  UniqueFd sources;
  auto set = compile_policies(opts_, /*optional=*/false, Compile::kPolicies, &sources);
  const bool applied = set.ok();
  if (!set.ok()) {
    spdlog::error("reload: keeping the current configuration and policies: {}", set.error().message);
  } else {
    // Engine, socket and front end user need a restart; policies, the
    // tool runner (its row and command), the key file and the run limit
    // change now. Warm sandboxes were made under the old set (its policies,
    // its venvs as they were): all end; the new set fills its own pools.
    end_pools();
    previous_ = std::move(set_.policies);
    previous_until_ = Clock::now() + kPreviousSetLifetime;
    set_.policies = std::move(set->policies);
    set_.e2b_key_file = set->e2b_key_file;
    set_.max_concurrent_runs = set->max_concurrent_runs;
    set_.shutdown_grace = set->shutdown_grace;
    sources_ = std::move(sources);
    for (const SpawnPolicy& p : set_.policies) spdlog::info("policy {} {}", q(p.name), p.fingerprint);
  }
  // The front end follows, from the same record of the same files (and
  // the E2B key), when the new set is in force here; nothing when it is not.
  UniqueFd key = applied ? open_key_file() : UniqueFd();
  const int fds[2] = {sources_.get(), key.get()};
  send(encode_reload(applied), applied ? fds : nullptr, applied ? (key ? 2 : 1) : 0);
}

// A sandbox's pidfd and its second descriptor (a run's report pipe, a warm
// sandbox's socket) join the epoll set, edge-triggered, tagged with the
// Sandbox's address: an event only names a sandbox to look at again
// (watch_sandboxes polls its descriptors), so one left over from a sandbox
// gone (its pidfd kept by the engine's clean-up until init is reaped, or a
// spawn's child holding a copy until its exec) changes nothing.
Status Spawner::watch(const isolate::Sandbox& sb, int second) {
  const auto tag = reinterpret_cast<std::uintptr_t>(&sb);
  epoll_event pid{EPOLLIN | EPOLLET, {.u64 = tag}}, other{EPOLLIN | EPOLLRDHUP | EPOLLET, {.u64 = tag}};
  if ((::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, sb.pidfd(), &pid) != 0 && errno != EEXIST) ||
      ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, second, &other) != 0)
    return Error::from_errno("epoll_ctl");
  return {};
}

// Every signal waiting on the signalfd: SIGHUP reloads; SIGTERM and SIGINT
// stop (the pools end, the front end is asked to drain and exit).
void Spawner::take_signals(Clock::time_point now) {
  signalfd_siginfo si{};
  while (::read(signals_.get(), &si, sizeof si) == static_cast<ssize_t>(sizeof si)) {
    if (si.ssi_signo == SIGHUP) {
      reload();
    } else if (!stopping_) {
      spdlog::info("signal {}: stopping", si.ssi_signo);
      sd_notify(0, "STOPPING=1");
      stopping_ = true;
      end_pools();
      // The front end drains (shutdown_grace), then exits; past that and
      // a margin it is killed.
      stop_deadline_ = now + set_.shutdown_grace + std::chrono::seconds(15);
      if (fe_pid_ > 0) ::kill(fe_pid_, SIGTERM);
    }
  }
}

// The front end's messages waiting on its socket, at most 64 a turn (the
// timers and the other descriptors are not starved); a socket that fails
// or closes is dropped, and the front end's pidfd then says it ended.
void Spawner::read_front_end() {
  for (int i = 0; i < 64 && control_; ++i) {
    std::vector<UniqueFd> fds;
    auto m = receive_message(control_.get(), &fds, MSG_DONTWAIT);
    if (!m.ok() && m.error().code == EAGAIN) break;
    if (!m.ok()) spdlog::error("front end socket: {}", m.error().message);
    if (!m.ok() || m->empty()) {  // empty: closed, the front end is ending; its pidfd says when
      control_.reset();
      break;
    }
    handle_message(*m, fds);
  }
}

// The sandboxes the epoll set named since the last turn, looked at again
// (their descriptors polled): runs whose pid 1 exited, or whose init
// reported the tool's status, get their Ended (finish); a warm sandbox that
// ended before its hand-over is lost; one whose runner wrote on its socket
// is ready. At most 256 a turn; the rest wait in the set for the next.
void Spawner::watch_sandboxes(Clock::time_point now) {
  epoll_event ev[256];
  std::vector<std::uintptr_t> named;
  for (int i = 0, n = ::epoll_wait(epoll_.get(), ev, 256, 0); i < n; ++i) named.push_back(ev[i].data.u64);
  if (named.empty()) return;
  std::sort(named.begin(), named.end());
  auto is_named = [&](const std::unique_ptr<isolate::Sandbox>& sb) {
    return std::binary_search(named.begin(), named.end(), reinterpret_cast<std::uintptr_t>(sb.get()));
  };
  for (auto it = runs_.begin(); it != runs_.end();) {
    Live& l = it->second;
    pollfd fd[2] = {{l.sb->pidfd(), POLLIN, 0}, {l.sb->report_fd(), POLLIN, 0}};
    const bool look = is_named(l.sb) && ::poll(fd, 2, 0) > 0;
    // init's last report is the tool's status: the run has ended, and its
    // Ended goes now, not after init's own exit (the namespaces' teardown,
    // a millisecond or more), which the engine reaps later.
    const bool exited = fd[0].revents & (POLLIN | POLLHUP | POLLERR);
    if (look && !exited) l.sb->read_reports(l.obs);
    const bool ended = look && (exited || l.obs.have_tool_status || (fd[1].revents & (POLLHUP | POLLERR)));
    if (ended) finish(l);
    it = ended ? runs_.erase(it) : std::next(it);
  }
  for (auto& [key, pool] : pools_)
    for (auto it = pool.idle.begin(); it != pool.idle.end();) {
      // Readable: its ready line (never read here); hung up: its runner is
      // gone, even while init still lives.
      const short in = it->ready ? POLLRDHUP : POLLIN | POLLRDHUP;
      pollfd fd[2] = {{it->sb->pidfd(), POLLIN, 0}, {it->in.get(), in, 0}};
      if (is_named(it->sb) && ::poll(fd, 2, 0) > 0 &&
          ((fd[0].revents & (POLLIN | POLLHUP | POLLERR)) || (fd[1].revents & (POLLRDHUP | POLLHUP | POLLERR)))) {
        it = pool.idle.erase(it);  // ended before its hand-over
        lose(pool, now);
        continue;
      }
      if (fd[1].revents & POLLIN) it->ready = true, pool.lost_in_a_row = 0;
      ++it;
    }
}

int Spawner::run() {
  // SIGTERM, SIGINT and SIGHUP arrive on the signalfd, read by the loop; a
  // write to a closed pipe or socket fails instead of killing the spawner.
  sigset_t set;
  sigemptyset(&set);
  for (int s : {SIGTERM, SIGINT, SIGHUP}) sigaddset(&set, s);
  if (::sigprocmask(SIG_BLOCK, &set, nullptr) != 0) return critical(Error::from_errno("sigprocmask").message);
  ::signal(SIGPIPE, SIG_IGN);
  signals_.reset(::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!signals_) return critical(Error::from_errno("signalfd").message);
  epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_) return critical(Error::from_errno("epoll_create1").message);
  auto thread = SpawnThread::start(*engine_);
  if (!thread.ok()) return critical(thread.error().message);
  spawn_thread_ = std::move(thread).value();
  if (auto st = start_front_end(); !st.ok()) return critical(st.error().message);
  // One turn: what is due is started, the loop waits for any of its
  // descriptors or the next deadline, then handles what came in this
  // order (a message of the front end before its end, so that its last
  // Kill still counts), then the deadlines, the pools and the clean-up.
  for (;;) {
    if (fe_pid_ < 0 && runs_.empty() && stopping_) break;
    // 1. A new front end, when one is due (front_end_gone).
    if (fe_pid_ < 0 && !stopping_ && Clock::now() >= restart_at_) {
      if (auto st = start_front_end(); !st.ok()) {
        spdlog::critical("{}", st.error().message);
        stopping_ = true;
        fe_exit_ = 1;
      }
    }
    // 2. The wait: the signals, the front end's socket and its pidfd, the
    // spawn thread's eventfd, and the epoll set of the sandboxes (watch()):
    // a turn no longer makes a system call per run.
    pollfd fds[5] = {{signals_.get(), POLLIN, 0},
                     {control_ ? control_.get() : -1, POLLIN, 0},
                     {fe_pidfd_ ? fe_pidfd_.get() : -1, POLLIN, 0},
                     {spawn_thread_->fd(), POLLIN, 0},
                     {epoll_.get(), POLLIN, 0}};
    auto now = Clock::now();
    auto timeout = poll_timeout(now);
    if (fe_pid_ < 0 && !stopping_) timeout = std::min(timeout, std::chrono::ceil<milliseconds>(restart_at_ - now));
    int n = ::poll(fds, 5, static_cast<int>(std::max<long long>(0, timeout.count())));
    if (n < 0 && errno != EINTR) return critical(Error::from_errno("poll").message);
    now = Clock::now();
    // 3. Signals: SIGHUP reloads, the others stop.
    if (fds[0].revents & POLLIN) take_signals(now);
    // 4. The front end's messages (at most 64 a turn).
    if (control_ && (fds[1].revents & (POLLIN | POLLHUP | POLLERR))) read_front_end();
    // 5. Runs that ended; warm sandboxes that ended or became ready, or
    // that the spawn thread made.
    if (fds[4].revents & POLLIN) watch_sandboxes(now);
    if (fds[3].revents & POLLIN) take_filled(now);
    // 6. The front end's end: its runs killed, another one due, or the stop.
    if (fe_pidfd_ && (fds[2].revents & POLLIN)) front_end_gone(now);
    // 7. A front end that does not stop in time is killed.
    if (stopping_ && fe_pid_ > 0 && now >= stop_deadline_) {
      spdlog::warn("the front end did not stop in time: killing it");
      ::kill(fe_pid_, SIGKILL);
      stop_deadline_ = Clock::time_point::max();
    }
    // 8. The runs' limits, the warm pools (refilled on a quiet turn), the
    // engine's pending clean-up.
    check_limits(now);
    tend_pools(now, n == 0 || !(fds[1].revents & POLLIN));
    (void)engine_->collect_retired();
  }
  end_pools();
  spawn_thread_.reset();  // a spawn under way finishes, and its sandbox ends
  (void)engine_->drain_retired(std::chrono::seconds(2));
  spdlog::info("stopped");
  return fe_exit_;
}

}  // namespace tsb::spawn
