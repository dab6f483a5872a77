#include "daemon/wire/compiled.h"

#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <cstring>


namespace tsb::spawn {
namespace {

constexpr std::uint32_t kMaxPolicies = 4096;
constexpr std::uint32_t kMaxInsns = 4096;  // BPF_MAXINSNS

isolate::Limits get_limits(Reader& r) {
  isolate::Limits l;
  l.memory_bytes = r.u64();
  l.pids = r.u64();
  l.cpu_quota_millicpus = r.u32();
  l.cpu_time = std::chrono::milliseconds(static_cast<std::int64_t>(r.u64() & INT64_MAX));
  l.wall_timeout = std::chrono::milliseconds(static_cast<std::int64_t>(r.u64() & INT64_MAX));
  l.tmp_bytes = r.u64();
  l.work_bytes = r.u64();
  l.file_size_bytes = r.u64();
  l.open_files = r.u64();
  l.stdout_bytes = r.u64();
  l.stderr_bytes = r.u64();
  return l;
}

// A seccomp program as the kernel takes it (a sock_filter array), never
// interpreted here; an empty one cannot be loaded: never "no filter".
std::shared_ptr<const isolate::SeccompProgram> get_program(Reader& r) {
  auto p = std::make_shared<isolate::SeccompProgram>();
  const std::string b = r.str(kMaxInsns * sizeof(sock_filter));
  if (b.empty() || b.size() % sizeof(sock_filter) != 0) r.fail();
  p->insns.resize(r.ok() ? b.size() / sizeof(sock_filter) : 0);
  std::copy_n(b.data(), p->insns.size() * sizeof(sock_filter), reinterpret_cast<char*>(p->insns.data()));
  return p;
}

// A file-system table (isolate/engine/fs.h): each row's kind, stage and flags
// known; its paths are checked where they are used (the engine makes the
// mounts, toolsandbox-init refuses "." and "..").
std::shared_ptr<const isolate::FsTable> get_table(Reader& r) {
  auto t = std::make_shared<isolate::FsTable>();
  std::uint32_t n = r.count(4096, 24);
  for (std::uint32_t i = 0; i < n && r.ok(); ++i) {
    isolate::FsEntry e;
    const std::uint8_t kind = r.u8(), stage = r.u8(), flags = r.u8();
    if (kind > isolate::kFsKindLast || stage >= static_cast<std::uint8_t>(isolate::Stage::kCount) || flags > 15) r.fail();
    e.kind = static_cast<isolate::FsEntry::Kind>(kind);
    e.stage = static_cast<isolate::Stage>(stage);
    e.tool_owned = flags & 1;
    e.noexec = flags & 2;
    e.optional = flags & 4;
    e.keyed = flags & 8;
    e.path = r.str(kMaxName);
    e.source = r.str(kMaxName);
    e.data = r.str(kMaxValue);
    e.size = r.u64();
    e.inodes = r.u32();
    e.mode = r.u32();
    t->push_back(std::move(e));
  }
  if (t->empty() || t->front().kind != isolate::FsEntry::kRoot) r.fail();
  return t;
}

std::map<std::string, std::string> get_map(Reader& r, std::uint32_t max_count) {
  std::map<std::string, std::string> m;
  std::uint32_t n = r.count(max_count, 8);
  for (std::uint32_t i = 0; i < n && r.ok(); ++i) {
    std::string k = r.str(kMaxName);
    std::string v = r.str(kMaxValue);
    if (!m.emplace(std::move(k), std::move(v)).second) r.fail();  // a name twice
  }
  return m;
}

}  // namespace

// ---- the compiled set ----------------------------------------------------

Result<CompiledSet> decode_compiled_set(std::string_view bytes) {
  if (bytes.substr(0, kSetMagic.size()) != kSetMagic)
    return Error::invalid("the compile helper's output is not a compiled policy set", EPROTO);
  Reader r(bytes.substr(kSetMagic.size()));
  CompiledSet s;
  isolate::EngineConfig& e = s.engine;
  isolate::CgroupPlacement& cg = e.cgroups;
  cg.mode = r.flag() ? isolate::CgroupMode::V1 : isolate::CgroupMode::V2;
  cg.parent = r.str(kMaxName);
  // (A braced list's elements are read in order: controller, then base.)
  for (std::uint32_t i = 0, nh = r.count(16, 8); i < nh && r.ok(); ++i)
    cg.hierarchies.push_back({r.str(kMaxName), r.str(kMaxName)});
  cg.make = r.strs(64, kMaxName);
  cg.join = r.str(kMaxName);
  cg.enable = r.strs(64, kMaxName);
  e.state_dir = r.str(kMaxName);
  e.uid_base = r.u32();
  e.uid_slots = r.u32();
  e.init_path = r.str(kMaxName);
  e.leaf_prefix = r.str(kMaxName);
  e.stale_leaves = r.strs(1u << 16, kMaxName);
  e.hide_host_paths = r.flag();
  e.landlock = r.flag();
  e.sandbox_oom_score_adj = r.i32();
  s.init_filter = get_program(r);
  s.socket_path = r.str(kMaxName);
  s.socket_mode = r.u32();
  s.socket_gid = r.u32();
  s.front_end_user = r.str(kMaxName);
  s.front_end_uid = r.u32();
  s.front_end_gid = r.u32();
  s.e2b_key_file = r.str(kMaxName);
  s.max_concurrent_runs = r.u32();
  s.shutdown_grace = std::chrono::milliseconds(static_cast<std::int64_t>(r.u64() & INT64_MAX));
  std::uint32_t n = r.count(kMaxPolicies, 64);
  for (std::uint32_t i = 0; i < n && r.ok(); ++i) {
    SpawnPolicy p;
    p.name = r.str(kMaxName);
    p.fingerprint = r.str(kMaxName);
    p.local = r.flag();
    p.limits = get_limits(r);
    p.workdir = r.str(kMaxName);
    p.hostname = r.str(kMaxName);
    p.network = static_cast<isolate::NetworkMode>(r.upto(static_cast<std::uint8_t>(isolate::NetworkMode::Egress)));
    p.env_set = get_map(r, kMaxEnvVars);
    p.env_allow = r.strs(kMaxEnvVars, kMaxName);
    p.seccomp = get_program(r);
    p.uid = r.u32();
    p.gid = r.u32();
    for (auto& m : p.modes) {
      m.argv = r.strs(64, kMaxValue);
      m.pooled_argv = r.strs(64, kMaxValue);
      m.end_note = r.flag();
      m.fs = get_table(r);
    }
    p.warm_max = r.upto(64);
    p.warm_min = r.upto(p.warm_max);
    p.warm_idle = std::chrono::milliseconds(static_cast<std::int64_t>(r.u64() & INT64_MAX));
    s.policies.push_back(std::move(p));
  }
  if (!r.done()) return Error::invalid("the compiled policy set is malformed", EPROTO);
  // What the engine and the front end's start rely on.
  if (s.front_end_uid == 0) return Error::invalid("the compiled set names uid 0 for the front end", EPROTO);
  for (const SpawnPolicy& p : s.policies)
    if (p.name.empty() || p.modes[0].argv.empty() || p.modes[0].argv[0].empty() || p.modes[0].argv[0][0] != '/')
      return Error::invalid("the compiled set holds a policy without a name or an absolute interpreter", EPROTO);
  return s;
}

isolate::RunSpec run_spec_from(const SpawnPolicy& p, RunMode mode, const std::string& venv, bool pooled,
                               const std::string& node_modules) {
  isolate::RunSpec s;
  const SpawnPolicy::Mode& m = p.modes[static_cast<int>(mode)];
  s.argv = pooled ? m.pooled_argv : m.argv;
  s.fs = m.fs;
  if (!venv.empty() || !node_modules.empty()) {  // per-tool (the caller checked the keys): in the cache a row names
    auto fs = std::make_shared<isolate::FsTable>(*s.fs);
    for (auto& e : *fs) {
      const std::string& key = e.path == isolate::kNodeModulesPath ? node_modules : venv;
      e.source = e.keyed && !key.empty() ? e.data + "/" + key : e.source;
    }
    s.fs = std::move(fs);
  }
  s.limits = p.limits;
  s.network = p.network;
  s.seccomp = p.seccomp;
  s.sandbox_uid = p.uid;
  s.sandbox_gid = p.gid;
  s.hostname = p.hostname;
  s.workdir = p.workdir;
  s.stdin_socket = mode == RunMode::Tool || pooled;  // the runner's result channel (daemon/frontend/letta/letta.h)
  s.end_note = pooled || m.end_note;  // the runner, or a script's launcher, writes it
  return s;
}

// ---- the environment -----------------------------------------------------

bool valid_env_name(std::string_view n) {
  if (n.empty() || n.size() > 256) return false;
  if (!(std::isalpha(static_cast<unsigned char>(n[0])) || n[0] == '_')) return false;
  return std::all_of(n.begin(), n.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
}

bool env_name_allowed(const std::vector<std::string>& env_allow, std::string_view n) {
  for (const auto& a : env_allow) {
    if (!a.empty() && a.back() == '*') {
      if (n.size() >= a.size() - 1 && n.compare(0, a.size() - 1, a, 0, a.size() - 1) == 0) return true;
    } else if (n == a) {
      return true;
    }
  }
  return false;
}

EnvProblem check_environment(const std::map<std::string, std::string>& env_set,
                             const std::vector<std::string>& env_allow, const std::map<std::string, std::string>& req,
                             std::string* name) {
  for (const auto& [k, v] : req) {
    *name = k;
    if (!valid_env_name(k)) return EnvProblem::kBadName;
    if (env_set.count(k)) return EnvProblem::kFixed;
    if (!env_name_allowed(env_allow, k)) return EnvProblem::kNotAllowed;
    if (v.find('\0') != std::string::npos) return EnvProblem::kNul;
  }
  name->clear();
  return EnvProblem::kOk;
}

std::vector<std::string> environment_of(const std::map<std::string, std::string>& env_set,
                                        const std::map<std::string, std::string>& req) {
  std::vector<std::string> env;
  for (const auto& [k, v] : env_set) env.push_back(k + "=" + v);
  for (const auto& [k, v] : req) env.push_back(k + "=" + v);
  return env;
}

// ---- messages ------------------------------------------------------------

std::string encode(const Hello& m) {
  Writer w;
  w.u8(static_cast<std::uint8_t>(Msg::Hello));
  w.str(m.instance);
  w.str(m.cgroup_mode);
  w.str(m.cgroup_summary);
  for (bool f : {m.features.memfd_noexec, m.features.overlay_views, m.features.tcp_memory_limit, m.features.oom_score_floor})
    w.u8(f);
  w.i32(m.features.landlock_abi);
  w.strs(m.notes);
  return w.take();
}

Result<RunOrder> decode_run(std::string_view b) {
  Reader r = open_message(b, Msg::Run);
  RunOrder m;
  m.id = r.u64();
  m.policy = r.str(kMaxName);
  m.fingerprint = r.str(kMaxName);
  m.mode = static_cast<RunMode>(r.upto(1));
  m.env = get_map(r, kMaxEnvVars);
  m.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(r.u64() & INT64_MAX));
  m.venv = r.str(64);
  m.warm = r.flag();
  m.node_modules = r.str(64);
  return finish_message(r, std::move(m), "run");
}

std::string encode(const Started& m) {
  Writer w;
  w.u8(static_cast<std::uint8_t>(Msg::Started));
  w.u64(m.id);
  w.str(m.run_id);
  w.u32(m.host_uid);
  w.u8(m.warm ? 1 : 0);
  return w.take();
}

std::string encode(const PoolState& m) {
  Writer w;
  w.u8(static_cast<std::uint8_t>(Msg::PoolState));
  w.u32(static_cast<std::uint32_t>(m.pools.size()));
  for (const auto& p : m.pools) {
    w.str(p.policy);
    w.u8(static_cast<std::uint8_t>(p.mode));
    for (std::uint32_t v : {p.ready, p.starting, p.target}) w.u32(v);
    for (std::uint64_t v : {p.hits, p.misses, p.lost}) w.u64(v);
  }
  return w.take();
}

std::string encode(const Refused& m) {
  Writer w;
  w.u8(static_cast<std::uint8_t>(Msg::Refused));
  w.u64(m.id);
  w.u8(static_cast<std::uint8_t>(m.code));
  w.str(m.message);
  return w.take();
}

std::string encode(const Ended& m) {
  const isolate::Observations& o = m.observations;
  Writer w;
  w.u8(static_cast<std::uint8_t>(Msg::Ended));
  w.u64(m.id);
  w.str(m.run_id);
  w.u32(m.host_uid);
  for (auto t : {m.wall, m.cpu, m.warm_start_cpu}) w.u64(static_cast<std::uint64_t>(t.count()));
  w.u64(m.peak_memory_bytes);
  for (bool f : {o.have_tool_status, o.have_setup_error, o.timed_out, o.output_exceeded, o.cpu_exceeded, o.cancelled,
                 o.backstop, o.socket_limit_reached})
    w.u8(f ? 1 : 0);
  for (int v : {o.tool_status, o.setup_stage, o.setup_errno, o.backstop_s, o.engine_errno, o.landlock}) w.i32(v);
  w.u64(o.oom_kills);
  w.u64(o.pids_max_hits);
  w.str(o.engine_error);
  w.str(o.setup_path);
  w.strs(o.moved_aside);
  return w.take();
}

Result<Kill> decode_kill(std::string_view b) {
  Reader r = open_message(b, Msg::Kill);
  Kill m;
  m.id = r.u64();
  return finish_message(r, m, "kill");
}

std::string encode_reload(bool applied) {
  Writer w;
  w.u8(static_cast<std::uint8_t>(Msg::Reload));
  w.u8(applied ? 1 : 0);
  return w.take();
}

Result<std::string> decode_notify(std::string_view b) {
  Reader r = open_message(b, Msg::Notify);
  std::string text = r.str(kMaxName);
  return finish_message(r, std::move(text), "notify");
}

// ---- the socket ----------------------------------------------------------

Status send_message(int sock, const std::string& bytes, const int* fds, std::size_t nfds, int flags) {
  if (bytes.size() > kMaxMessage) return Error::invalid("message too large for the spawner socket", EMSGSIZE);
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int) * 4)] = {};
  if (nfds > 0) {
    if (nfds > 4) return Error::invalid("too many descriptors for one message");
    mh.msg_control = ctrl;
    mh.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
    cmsghdr* c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
    std::memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
  }
  for (;;) {
    ssize_t n = ::sendmsg(sock, &mh, MSG_NOSIGNAL | flags);
    if (n >= 0) return {};
    if (errno != EINTR) return Error::from_errno("sendmsg");
  }
}

Result<std::string> receive_message(int sock, std::vector<UniqueFd>* fds, int flags) {
  // The size first (MSG_TRUNC with MSG_PEEK gives a packet's real length),
  // so a small message takes a small buffer. A larger one than allowed is
  // still received, cut short, and refused below.
  ssize_t len;
  do len = ::recv(sock, nullptr, 0, MSG_PEEK | MSG_TRUNC | flags);
  while (len < 0 && errno == EINTR);
  if (len < 0) return Error::from_errno("recv");
  std::string buf(std::min<std::size_t>(static_cast<std::size_t>(len), kMaxMessage) + 1, '\0');
  iovec iov{buf.data(), buf.size()};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int) * 4)];
  mh.msg_control = ctrl;
  mh.msg_controllen = sizeof ctrl;
  ssize_t n;
  do n = ::recvmsg(sock, &mh, MSG_CMSG_CLOEXEC | flags);
  while (n < 0 && errno == EINTR);
  if (n < 0) return Error::from_errno("recvmsg");
  // Take every descriptor that came, even from a message refused below, so
  // none is leaked.
  std::vector<UniqueFd> got;
  for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    std::size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < k; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      got.emplace_back(fd);
    }
  }
  // Descriptors the receiver had no room for (its RLIMIT_NOFILE) are
  // dropped by the kernel (MSG_CTRUNC): the message itself is whole, and
  // the caller sees fewer descriptors than the message type carries.
  if (mh.msg_flags & MSG_TRUNC) return Error::invalid("a message was cut short", EMSGSIZE);
  if (static_cast<std::size_t>(n) > kMaxMessage) return Error::invalid("a message was too large", EMSGSIZE);
  buf.resize(static_cast<std::size_t>(n));
  if (fds) *fds = std::move(got);
  return buf;
}

}  // namespace tsb::spawn
