#include "daemon/core/server.h"

#include <grp.h>
#include <spdlog/spdlog.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/read_until.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>
#include <fstream>

#include "daemon/core/e2b.h"
#include "daemon/core/letta_result.h"
#include "daemon/core/result_json.h"
#include "daemon/core/units.h"
#include "isolate/hash.h"
#include "isolate/jsonc.h"
#include "isolate/supervise.h"
#include "protocol/letta.h"

namespace tsb::core {
namespace {

using asio::use_awaitable;
using nlohmann::json;
using protocol::ErrorCode;
using namespace asio::experimental::awaitable_operators;
constexpr auto tuple_awaitable = asio::experimental::as_tuple(use_awaitable);

std::string q(std::string_view s) { return quoted_for_message(s); }

Peer peer_of(int fd) {
  ucred cr{};
  socklen_t len = sizeof cr;
  Peer p;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) == 0) {
    p.pid = cr.pid;
    p.uid = cr.uid;
    p.gid = cr.gid;
  } else {
    p.uid = static_cast<uid_t>(-1);
    p.gid = static_cast<gid_t>(-1);
  }
  return p;
}

// Supplementary groups of the peer, read from /proc (SO_PEERCRED carries
// only the primary gid). Racy against pid reuse only in the direction of
// refusing: a reused pid belongs to another process with other groups.
std::vector<gid_t> peer_groups(pid_t pid) {
  std::vector<gid_t> out;
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Groups:", 0) != 0) continue;
    std::istringstream s(line.substr(7));
    gid_t g;
    while (s >> g) out.push_back(g);
  }
  return out;
}

bool file_is_root_owned_readonly(const std::string& p) {
  struct stat st{};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == 0 && !(st.st_mode & (S_IWGRP | S_IWOTH)) &&
         (st.st_mode & S_IROTH);
}

}  // namespace

std::string find_runner(const std::string& configured) {
  std::vector<std::string> candidates;
  if (!configured.empty()) candidates.push_back(configured);
  candidates.push_back(std::string(TSB_DATADIR) + "/runner/toolsandbox_runner.py");
  char exe[4096];
  ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    exe[n] = '\0';
    std::string dir(exe);
    dir = dir.substr(0, dir.rfind('/'));
    candidates.push_back(dir + "/../share/toolsandbox/runner/toolsandbox_runner.py");
  }
  candidates.push_back(std::string(TSB_SOURCE_DIR) + "/daemon/runner/toolsandbox_runner.py");
  for (const auto& c : candidates)
    if (file_is_root_owned_readonly(c)) return c;
  return "";
}

Server::Server(asio::io_context& io, std::string config_path, DaemonConfig cfg, std::unique_ptr<isolate::Engine> engine,
               std::shared_ptr<const PolicySet> policies)
    : io_(io),
      config_path_(std::move(config_path)),
      cfg_(std::move(cfg)),
      engine_(std::move(engine)),
      policies_(std::move(policies)),
      signals_(io, SIGTERM, SIGINT, SIGHUP) {
  runner_path_ = find_runner(cfg_.runner_path);
  if (cfg_.e2b.enabled) e2b_ = std::make_unique<E2BBackend>(io_, cfg_.e2b);
}

Server::~Server() {
  if (owns_socket_file_) ::unlink(cfg_.socket_path.c_str());
}

Status Server::open_listener() {
  // The E2B API key is read before anything listens: a key file others can
  // read stops the daemon here.
  if (e2b_)
    if (auto st = e2b_->load_key(); !st.ok()) return st;
  int n = sd_listen_fds(1);
  if (n > 1) return Error::invalid("systemd passed " + std::to_string(n) + " sockets; toolsandboxd takes exactly one");
  if (n == 1) {
    if (sd_is_socket_unix(SD_LISTEN_FDS_START, SOCK_STREAM, 1, nullptr, 0) <= 0)
      return Error::invalid("the socket systemd passed is not a listening Unix stream socket");
    acceptor_ = std::make_unique<asio::local::stream_protocol::acceptor>(io_);
    asio::error_code ec;
    acceptor_->assign(asio::local::stream_protocol(), SD_LISTEN_FDS_START, ec);
    if (ec) return Error::invalid("adopting the systemd socket: " + ec.message());
    spdlog::info("listening on the socket passed by systemd");
    return {};
  }
  std::string dir = cfg_.socket_path.substr(0, cfg_.socket_path.rfind('/'));
  if (!dir.empty() && ::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
    return Error::from_errno("mkdir '" + dir + "'");
  // A stale socket file from a crashed instance: remove it, but only if
  // nothing answers on it (a second daemon must not steal the first's path).
  struct stat st{};
  if (::lstat(cfg_.socket_path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) return Error::invalid("'" + cfg_.socket_path + "' exists and is not a socket", EEXIST);
    asio::local::stream_protocol::socket probe(io_);
    asio::error_code ec;
    probe.connect(asio::local::stream_protocol::endpoint(cfg_.socket_path), ec);
    if (!ec) return Error::invalid("another toolsandboxd is listening on '" + cfg_.socket_path + "'", EADDRINUSE);
    ::unlink(cfg_.socket_path.c_str());
  }
  acceptor_ = std::make_unique<asio::local::stream_protocol::acceptor>(io_);
  asio::error_code ec;
  acceptor_->open(asio::local::stream_protocol(), ec);
  // Created with no access for anyone but root, then opened up to the
  // configured mode and group: never briefly world-connectable.
  mode_t old = ::umask(0177);
  if (!ec) acceptor_->bind(asio::local::stream_protocol::endpoint(cfg_.socket_path), ec);
  ::umask(old);
  if (ec) return Error::invalid("binding '" + cfg_.socket_path + "': " + ec.message());
  owns_socket_file_ = true;
  gid_t gid = 0;
  if (!cfg_.socket_group.empty()) {
    group* g = ::getgrnam(cfg_.socket_group.c_str());
    if (!g) return Error::invalid("socket group " + q(cfg_.socket_group) + " does not exist");
    gid = g->gr_gid;
  }
  if (::chown(cfg_.socket_path.c_str(), 0, gid) != 0) return Error::from_errno("chown socket");
  if (::chmod(cfg_.socket_path.c_str(), cfg_.socket_mode) != 0) return Error::from_errno("chmod socket");
  acceptor_->listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return Error::invalid("listen: " + ec.message());
  spdlog::info("listening on {} (mode {:o}, group {})", cfg_.socket_path, cfg_.socket_mode, gid);
  return {};
}

void Server::start() {
  asio::co_spawn(io_, accept_loop(), asio::detached);
  asio::co_spawn(io_, signal_loop(), asio::detached);
  if (runner_path_.empty())
    spdlog::warn("the tool runner was not found (set \"runner\" in the configuration): run_tool requests will fail");
  sd_notify(0, "READY=1\nSTATUS=accepting requests");
}

bool Server::peer_allowed(const Peer& p) const {
  for (uid_t u : cfg_.allowed_uids)
    if (u == p.uid) return true;
  if (cfg_.allowed_gids.empty()) return false;
  for (gid_t g : cfg_.allowed_gids)
    if (g == p.gid) return true;
  for (gid_t pg : peer_groups(p.pid))
    for (gid_t g : cfg_.allowed_gids)
      if (g == pg) return true;
  return false;
}

asio::awaitable<void> Server::accept_loop() {
  for (;;) {
    auto [ec, sock] = co_await acceptor_->async_accept(tuple_awaitable);
    if (ec) {
      if (shutting_down_ || ec == asio::error::operation_aborted) co_return;
      spdlog::warn("accept: {}", ec.message());
      continue;
    }
    ++connections_;
    asio::co_spawn(io_, serve(std::move(sock)), asio::detached);
  }
}

asio::awaitable<void> Server::serve(socket_t sock) {
  // One bad peer must never take the daemon down: everything is caught here.
  try {
    Peer peer = peer_of(sock.native_handle());
    if (!peer_allowed(peer)) {
      spdlog::warn("refused peer uid={} gid={} pid={}", peer.uid, peer.gid, peer.pid);
      std::string line = protocol::encode_error("", ErrorCode::Unauthorized,
                                                "uid " + std::to_string(peer.uid) + " is not allowed to use this daemon");
      co_await asio::async_write(sock, asio::buffer(line), tuple_awaitable);
      co_return;
    }
    std::string buf;
    for (;;) {
      if (shutting_down_) {
        std::string line = protocol::encode_error("", ErrorCode::Unavailable, "the daemon is shutting down");
        co_await asio::async_write(sock, asio::buffer(line), tuple_awaitable);
        co_return;
      }
      // The frame cap is enforced while reading, before any parsing.
      asio::steady_timer deadline(io_, cfg_.request_timeout);
      auto res = co_await (asio::async_read_until(sock, asio::dynamic_buffer(buf, cfg_.max_frame_bytes + 1), '\n',
                                                  tuple_awaitable) ||
                           deadline.async_wait(tuple_awaitable));
      if (res.index() == 1) {
        std::string line = protocol::encode_error(
            "", ErrorCode::Timeout,
            "no complete request line within " + format_duration(cfg_.request_timeout) + "; closing");
        co_await asio::async_write(sock, asio::buffer(line), tuple_awaitable);
        co_return;
      }
      auto [ec, n] = std::get<0>(res);
      if (ec == asio::error::not_found || (!ec && n > cfg_.max_frame_bytes + 1)) {
        std::string line = protocol::encode_error("", ErrorCode::TooLarge,
                                                  "request larger than " + format_size(cfg_.max_frame_bytes) + "; closing");
        co_await asio::async_write(sock, asio::buffer(line), tuple_awaitable);
        co_return;
      }
      if (ec == asio::error::eof && !buf.empty()) {
        std::string line = protocol::encode_error("", ErrorCode::BadRequest, "connection closed in the middle of a request line");
        co_await asio::async_write(sock, asio::buffer(line), tuple_awaitable);
        co_return;
      }
      if (ec) co_return;  // eof between requests, reset, ...
      std::string frame = buf.substr(0, n - 1);
      buf.erase(0, n);
      if (!frame.empty() && frame.back() == '\r') frame.pop_back();
      if (frame.size() > cfg_.max_frame_bytes) {
        std::string line = protocol::encode_error("", ErrorCode::TooLarge, "request larger than " + format_size(cfg_.max_frame_bytes));
        co_await asio::async_write(sock, asio::buffer(line), tuple_awaitable);
        co_return;
      }
      std::string id;
      auto decoded = protocol::decode_request(frame, &id);
      std::string reply;
      if (auto* perr = std::get_if<protocol::ProtocolError>(&decoded)) {
        reply = protocol::encode_error(id, perr->code, perr->message);
      } else {
        reply = co_await dispatch(std::get<protocol::Request>(decoded), peer, sock);
      }
      auto [wec, wn] = co_await asio::async_write(sock, asio::buffer(reply), tuple_awaitable);
      if (wec) co_return;
    }
  } catch (const std::exception& e) {
    spdlog::error("connection handler: {}", e.what());
  }
}

asio::awaitable<std::string> Server::dispatch(const protocol::Request& req, const Peer& peer, socket_t& sock) {
  if (std::holds_alternative<protocol::StatusRequest>(req.body)) co_return protocol::encode_ok(req.id, "status", status_json());
  co_return co_await run_local(req, peer, sock);
}

asio::awaitable<Server::Slot> Server::acquire_slot() {
  if (shutting_down_) co_return Slot::ShuttingDown;
  if (in_flight_ < cfg_.max_concurrent_runs) {
    ++in_flight_;
    co_return Slot::Granted;
  }
  if (waiters_.size() >= cfg_.max_queued_runs) {
    ++rejected_busy_;
    co_return Slot::Busy;
  }
  auto w = std::make_shared<Waiter>(io_);
  waiters_.push_back(w);
  co_await w->timer.async_wait(tuple_awaitable);  // cancelled by release_slot (or shutdown)
  if (!w->granted) co_return Slot::ShuttingDown;   // woken by shutdown, holds no slot
  if (shutting_down_) {
    release_slot();  // the slot it was handed goes back: nothing new starts
    co_return Slot::ShuttingDown;
  }
  co_return Slot::Granted;
}

void Server::release_slot() {
  if (!waiters_.empty() && !shutting_down_) {
    auto w = waiters_.front();  // the slot passes to the oldest waiter
    waiters_.pop_front();
    w->granted = true;
    w->timer.cancel();
    return;
  }
  --in_flight_;
}

asio::awaitable<std::string> Server::run_local(const protocol::Request& req, const Peer& peer, socket_t& sock) {
  const bool tool_mode = std::holds_alternative<protocol::RunToolRequest>(req.body);
  const protocol::CommonRunFields& c =
      tool_mode ? std::get<protocol::RunToolRequest>(req.body).common : std::get<protocol::ExecuteRequest>(req.body).common;

  auto policies = policies_;  // this run keeps the set it started with, across reloads
  auto placement = place_run(*policies, c.organization_id, c.policy, cfg_.e2b.enabled);
  if (!placement.ok()) co_return protocol::encode_error(req.id, ErrorCode::PolicyDenied, placement.error().message);
  const Policy& pol = *placement->policy;
  if (placement->backend == Backend::E2B) {
    if (!e2b_ || !cfg_.e2b.enabled)
      co_return protocol::encode_error(req.id, ErrorCode::Unavailable,
                                       "organization " + q(c.organization_id) + " runs on E2B, which is not configured in this daemon");
    // E2B runs take no local run slot; E2BConfig.max_sandboxes bounds them.
    auto reply = co_await e2b_->run(req, peer, sock, *placement, runner_path_);
    if (!reply.end_reason.empty()) ++totals_[reply.end_reason];
    co_return reply.line;
  }

  std::optional<std::string> fingerprint;
  if (c.sandbox_config) {
    auto fp = protocol::sandbox_config_fingerprint(c.sandbox_config->type, c.organization_id, c.sandbox_config->config);
    if (!fp.ok()) co_return protocol::encode_error(req.id, ErrorCode::BadRequest, "sandbox_config: " + fp.error().message);
    fingerprint = *fp;
  }

  // The tool's environment: the policy's fixed values plus the request's,
  // for names the policy allows. Never the daemon's own environment.
  std::map<std::string, std::string> env = c.env;
  if (c.agent_id) env["LETTA_AGENT_ID"] = *c.agent_id;
  if (c.project_id) env["LETTA_PROJECT_ID"] = *c.project_id;
  auto envv = build_environment(pol, env);
  if (!envv.ok()) co_return protocol::encode_error(req.id, ErrorCode::PolicyDenied, envv.error().message);

  isolate::RunSpec spec = run_spec_from(pol);
  spec.env = std::move(envv).value();
  spec.label = c.tool_name;
  if (c.timeout_s) {
    auto want = std::chrono::milliseconds(static_cast<long long>(*c.timeout_s * 1000.0 + 0.5));
    if (want < spec.limits.wall_timeout) spec.limits.wall_timeout = std::max(want, std::chrono::milliseconds(1));
  }
  ShapeContext shape;
  shape.tool_name = c.tool_name;
  shape.timeout_s = c.timeout_s && std::chrono::milliseconds(static_cast<long long>(*c.timeout_s * 1000.0 + 0.5)) <= pol.limits.wall_timeout
                        ? *c.timeout_s
                        : pol.limits.wall_timeout.count() / 1000.0;
  shape.fingerprint = fingerprint;
  shape.tool_mode = tool_mode;
  shape.memory_limit = spec.limits.memory_bytes;
  shape.pids_limit = spec.limits.pids;

  std::string stdin_data;
  if (tool_mode) {
    if (runner_path_.empty())
      co_return protocol::encode_error(req.id, ErrorCode::Internal, "the tool runner is not installed on this host");
    const auto& t = std::get<protocol::RunToolRequest>(req.body);
    shape.nonce = random_hex(16);
    json rq = runner_request_json(t, shape.nonce);
    stdin_data = dump_json(rq);
    spec.binds.push_back({runner_path_, kRunnerSandboxPath, false, false});
    spec.argv = {pol.interpreter, "-I", "-S", "-B", "-u", "-X", "utf8", kRunnerSandboxPath};
  } else {
    // The script arrives on stdin, so no size limit of argv applies and it
    // never touches a file system.
    stdin_data = std::get<protocol::ExecuteRequest>(req.body).script;
    spec.argv = {pol.interpreter, "-"};
  }

  Slot slot = co_await acquire_slot();
  if (slot == Slot::Busy)
    co_return protocol::encode_error(req.id, ErrorCode::Busy,
                                     "too many runs in flight (" + std::to_string(in_flight_) + " running, " +
                                         std::to_string(waiters_.size()) + " queued); retry later");
  if (slot == Slot::ShuttingDown) co_return protocol::encode_error(req.id, ErrorCode::Unavailable, "the daemon is shutting down");

  struct SlotGuard {
    Server* s;
    ~SlotGuard() { s->release_slot(); }
  } guard{this};

  auto t0 = std::chrono::steady_clock::now();
  isolate::RunResult run;
  auto spawned = engine_->spawn(spec);
  if (!spawned.ok()) {
    run = isolate::setup_failure_result(spawned.error());
    spdlog::error("spawn failed: {}", spawned.error().message);
  } else {
    std::shared_ptr<isolate::Sandbox> sb(std::move(spawned).value());
    live_.insert(sb);
    // A client that goes away mid-run gets its run killed: watch the
    // socket for EOF while the run goes on.
    auto watching = std::make_shared<bool>(true);
    asio::co_spawn(io_, [&sock, sb, watching]() -> asio::awaitable<void> {
      while (*watching) {
        auto [ec] = co_await sock.async_wait(socket_t::wait_read, tuple_awaitable);
        if (ec || !*watching) co_return;
        // POLLHUP: the peer closed its end entirely. A half-close
        // (shutdown(SHUT_WR) after sending the request) shows as POLLRDHUP
        // only: that client still waits for its answer.
        pollfd pfd{sock.native_handle(), POLLIN | POLLRDHUP, 0};
        if (::poll(&pfd, 1, 0) < 0) co_return;
        if (pfd.revents & (POLLHUP | POLLERR)) {
          sb->cancel();
          co_return;
        }
        co_return;  // half-closed, or a pipelined request: handled after this one
      }
    }, asio::detached);
    run = co_await isolate::supervise(sb, std::move(stdin_data));
    *watching = false;
    asio::error_code ignored;
    sock.cancel(ignored);
    live_.erase(sb);
  }
  auto shaped = shape_tool_result(shape, run);
  json record = run_record_json(run);
  record["policy"] = pol.name;
  record["policy_fingerprint"] = pol.fingerprint;
  record["backend"] = "local";
  // Local runs use the policy's read-only venv: nothing is installed per run
  // (a shared, writable venv is how Letta's local sandbox gets poisoned).
  if (tool_mode && !std::get<protocol::RunToolRequest>(req.body).pip_requirements.empty())
    record["pip_requirements_ignored"] = true;
  for (auto it = shaped.extra.begin(); it != shaped.extra.end(); ++it) record[it.key()] = it.value();
  json result = shaped.result;
  result["record"] = record;
  ++totals_[std::string(isolate::to_string(run.reason))];

  auto ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  // One audit line per run. Client strings are quoted with every control
  // character escaped; env values and agent_state never appear.
  spdlog::info(
      "audit run_id={} request_id={} peer_uid={} peer_pid={} org={} tool={} mode={} policy={} policy_fingerprint={} "
      "backend=local duration_ms={:.1f} end_reason={} exit_code={} status={} stdout_bytes={} stderr_bytes={}",
      run.run_id.empty() ? "-" : run.run_id, q(req.id), peer.uid, peer.pid, q(c.organization_id), q(c.tool_name),
      tool_mode ? "run_tool" : "execute", q(pol.name), pol.fingerprint, ms, isolate::to_string(run.reason),
      run.exit_code, result["status"].get<std::string>(), run.stdout_total_bytes, run.stderr_total_bytes);
  co_return protocol::encode_ok(req.id, "result", result);
}

json Server::status_json() const {
  json totals = json::object();
  for (const auto& [k, v] : totals_) totals[k] = v;
  json pols = json::object();
  for (const auto& [name, p] : policies_->policies) pols[name] = p->fingerprint;
  return {{"version", TSB_VERSION},
          {"uptime_s", std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count()},
          {"runs_in_flight", in_flight_},
          {"runs_queued", waiters_.size()},
          {"max_concurrent_runs", cfg_.max_concurrent_runs},
          {"max_queued_runs", cfg_.max_queued_runs},
          {"totals", totals},
          {"rejected_busy", rejected_busy_},
          {"connections", connections_},
          {"cgroup_mode", isolate::to_string(engine_->cgroups().mode())},
          {"policies", pols},
          {"e2b_configured", cfg_.e2b.enabled},
          {"e2b", e2b_ ? e2b_->status_json() : json()},
          {"shutting_down", shutting_down_}};
}

void Server::reload() {
  sd_notify(0, "RELOADING=1");
  auto cfg = config_path_.empty() ? Result<DaemonConfig>(cfg_) : load_daemon_config(config_path_, true);
  if (!cfg.ok()) {
    spdlog::error("reload: keeping the current configuration and policies: {}", cfg.error().message);
    sd_notify(0, "READY=1");
    return;
  }
  auto set = load_policy_set(*cfg);
  if (!set.ok()) {
    spdlog::error("reload: keeping the current configuration and policies: {}", set.error().message);
    sd_notify(0, "READY=1");
    return;
  }
  // The E2B key is re-read (and its file checked) before anything changes.
  if (cfg->e2b.enabled) {
    if (!e2b_) e2b_ = std::make_unique<E2BBackend>(io_, cfg->e2b);
    if (auto st = e2b_->reconfigure(cfg->e2b); !st.ok()) {
      spdlog::error("reload: keeping the current configuration and policies: {}", st.error().message);
      sd_notify(0, "READY=1");
      return;
    }
  }
  // Engine settings (cgroup parent, uid range) and the socket need a restart.
  isolate::EngineConfig keep_engine = cfg_.engine;
  std::string keep_socket = cfg_.socket_path;
  cfg_ = std::move(cfg).value();
  cfg_.engine = keep_engine;
  cfg_.socket_path = keep_socket;
  policies_ = std::move(set).value();
  runner_path_ = find_runner(cfg_.runner_path);
  for (const auto& [name, p] : policies_->policies) spdlog::info("policy {} {}", q(name), p->fingerprint);
  spdlog::info("reloaded configuration and {} policies", policies_->policies.size());
  sd_notify(0, "READY=1");
}

asio::awaitable<void> Server::signal_loop() {
  for (;;) {
    auto [ec, sig] = co_await signals_.async_wait(tuple_awaitable);
    if (ec) co_return;
    if (sig == SIGHUP) {
      reload();
      continue;
    }
    spdlog::info("signal {}: stopping", sig);
    co_await shutdown_sequence();
    co_return;
  }
}

asio::awaitable<void> Server::shutdown_sequence() {
  sd_notify(0, "STOPPING=1");
  shutting_down_ = true;
  asio::error_code ec;
  if (acceptor_) acceptor_->close(ec);
  // Queued requests will not start.
  for (auto& w : waiters_) w->timer.cancel();  // not granted: they answer `unavailable`
  waiters_.clear();
  // In-flight runs may finish within the grace period, then are killed.
  auto deadline = std::chrono::steady_clock::now() + cfg_.shutdown_grace;
  if (e2b_) co_await e2b_->shutdown(cfg_.shutdown_grace);
  asio::steady_timer t(io_);
  while (!live_.empty() && std::chrono::steady_clock::now() < deadline) {
    t.expires_after(std::chrono::milliseconds(50));
    co_await t.async_wait(tuple_awaitable);
  }
  if (!live_.empty()) {
    spdlog::warn("grace period over: killing {} runs", live_.size());
    for (auto& sb : live_) sb->cancel();
    while (!live_.empty()) {
      t.expires_after(std::chrono::milliseconds(20));
      co_await t.async_wait(tuple_awaitable);
    }
  }
  // Let the last responses go out, then stop.
  t.expires_after(std::chrono::milliseconds(100));
  co_await t.async_wait(tuple_awaitable);
  io_.stop();
}

}  // namespace tsb::core
