// A session workspace's sandbox and its keeper (workspace.h).
#include "daemon/frontend/session/workspace.h"

#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <array>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/read.hpp>
#include <asio/write.hpp>
#include <asio/use_awaitable.hpp>
#include <cmath>
#include <csignal>
#include <cstring>

#include "daemon/common/quote.h"
#include "daemon/frontend/egress/proxy.h"
#include "daemon/frontend/local/spawner_link.h"
#include "daemon/policy/sessions.h"
#include "protocol/json_limits.h"

namespace tsb::core {

using protocol::ErrorCode;

namespace {

constexpr auto tuple_awaitable = asio::experimental::as_tuple(asio::use_awaitable);
constexpr std::uint32_t kMaxKeeperAnswer = 4096;

// The keeper's own stdout or stderr (nothing, unless the protocol between
// it and this process broke): logged, escaped, the first 4 KiB.
asio::awaitable<void> log_keeper_output(std::shared_ptr<Workspace> ws, UniqueFd fd) {
  asio::posix::stream_descriptor sd(ws->keeper.get_executor(), fd.release());
  std::array<char, 4096> buf;
  std::size_t logged = 0;
  for (;;) {
    auto [ec, n] = co_await sd.async_read_some(asio::buffer(buf), tuple_awaitable);
    if (ec) break;
    if (logged < buf.size())
      spdlog::warn("workspace {}: its keeper says {}", ws->id, quoted_for_message(std::string_view(buf.data(), n)));
    logged += n;
  }
}

// Ends the workspace once it has had no session for the policy's idle_ttl.
asio::awaitable<void> expire(std::shared_ptr<Workspace> ws) {
  asio::steady_timer t(ws->keeper.get_executor());
  const auto ttl = ws->policy->sessions.workspace_idle_ttl;
  while (!ws->ended) {
    if (ws->started && !ws->busy && std::chrono::steady_clock::now() >= ws->last_used + ttl) {
      ws->end("ttl");
      break;
    }
    t.expires_after(std::chrono::milliseconds(500));
    co_await t.async_wait(tuple_awaitable);
  }
}

}  // namespace

std::string workspace_key(std::uint32_t peer_uid, const std::string& organization_id, const std::string& policy,
                          const std::string& name) {
  return std::to_string(peer_uid) + '\0' + organization_id + '\0' + policy + '\0' + name;
}

std::string keeper_session_message(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env) {
  nlohmann::json e = nlohmann::json::object();
  for (const auto& [k, v] : env) e[k] = v;
  return nlohmann::json{{"argv", argv}, {"env", e}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

ErrorCode refusal_code(spawn::RefuseCode rc) {
  using spawn::RefuseCode;
  return rc == RefuseCode::Busy                                              ? ErrorCode::Busy
         : rc == RefuseCode::Unavailable || rc == RefuseCode::UnknownPolicy ? ErrorCode::Unavailable
         : rc == RefuseCode::OutOfBounds                                     ? ErrorCode::PolicyDenied
                                                                             : ErrorCode::Internal;
}

std::optional<KeeperStatus> parse_keeper_status(std::string_view body) {
  // (At most kMaxKeeperAnswer bytes, from the sandbox: bounded parse.)
  nlohmann::json j = protocol::parse_json_bounded(body);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  KeeperStatus st;
  const auto exit = j.find("exit"), sig = j.find("signal"), cpu = j.find("cpu_ms");
  if ((exit == j.end()) == (sig == j.end())) return std::nullopt;  // one of them
  if (exit != j.end()) {
    if (!exit->is_number_integer() || exit->get<long long>() < 0 || exit->get<long long>() > 255) return std::nullopt;
    st.exit_code = exit->get<int>();
  } else {
    if (!sig->is_number_integer() || sig->get<long long>() < 1 || sig->get<long long>() > 64) return std::nullopt;
    st.signal = sig->get<int>();
  }
  if (cpu == j.end() || !cpu->is_number() || !std::isfinite(cpu->get<double>()) || cpu->get<double>() < 0)
    return std::nullopt;
  st.cpu_ms = cpu->get<double>();
  return st;
}

namespace {

std::string keeper_message(std::string_view body) {
  const auto n = static_cast<std::uint32_t>(body.size());
  std::string m{static_cast<char>(n >> 24), static_cast<char>(n >> 16), static_cast<char>(n >> 8), static_cast<char>(n)};
  m += body;
  return m;
}

// One sendmsg of `m` with `fds` attached, without waiting: the bytes sent,
// or -1 (errno set).
ssize_t send_with_fds(int sock, std::string_view m, std::span<const int> fds) {
  iovec iov{const_cast<char*>(m.data()), m.size()};
  msghdr h{};
  h.msg_iov = &iov;
  h.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(3 * sizeof(int))] = {};
  if (!fds.empty()) {
    h.msg_control = control;
    h.msg_controllen = CMSG_SPACE(fds.size() * sizeof(int));
    cmsghdr* c = CMSG_FIRSTHDR(&h);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(fds.size() * sizeof(int));
    std::memcpy(CMSG_DATA(c), fds.data(), fds.size() * sizeof(int));
  }
  return ::sendmsg(sock, &h, MSG_DONTWAIT | MSG_NOSIGNAL);
}

}  // namespace

asio::awaitable<bool> send_session_to_keeper(Workspace& ws, const std::string& body, std::span<const int> fds) {
  if (!ws.keeper.is_open() || fds.size() > 3 || body.size() > kMaxKeeperMessage) co_return false;
  const std::string m = keeper_message(body);
  // The descriptors go with the first bytes; the keeper reads the rest as
  // they come (an environment may be larger than the socket's buffer).
  ssize_t n;
  while ((n = send_with_fds(ws.keeper.native_handle(), m, fds)) < 0) {
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) co_return false;
    auto [ec] = co_await ws.keeper.async_wait(asio::socket_base::wait_write, tuple_awaitable);
    if (ec) co_return false;
  }
  auto [ec, written] = co_await asio::async_write(ws.keeper, asio::buffer(m.data() + n, m.size() - n), tuple_awaitable);
  co_return !ec;
}

bool send_end_to_keeper(Workspace& ws) {
  const std::string m = keeper_message(R"({"end": true})");
  return ws.keeper.is_open() && send_with_fds(ws.keeper.native_handle(), m, {}) == static_cast<ssize_t>(m.size());
}

bool forwarded_signal(int signal) {
  return signal == SIGHUP || signal == SIGINT || signal == SIGQUIT || signal == SIGUSR1 || signal == SIGUSR2 ||
         signal == SIGTERM || signal == SIGWINCH;
}

bool send_signal_to_keeper(Workspace& ws, int signal) {
  if (!forwarded_signal(signal)) return false;
  const std::string m = keeper_message(nlohmann::json{{"signal", signal}}.dump());
  return ws.keeper.is_open() && send_with_fds(ws.keeper.native_handle(), m, {}) == static_cast<ssize_t>(m.size());
}

asio::awaitable<std::optional<KeeperStatus>> read_keeper_status(Workspace& ws) {
  std::array<unsigned char, 4> head{};
  if (auto [ec, n] = co_await asio::async_read(ws.keeper, asio::buffer(head), tuple_awaitable); ec) co_return std::nullopt;
  const std::uint32_t len = (std::uint32_t{head[0]} << 24) | (std::uint32_t{head[1]} << 16) |
                            (std::uint32_t{head[2]} << 8) | head[3];
  if (len > kMaxKeeperAnswer) co_return std::nullopt;
  std::string body(len, '\0');
  if (auto [ec, n] = co_await asio::async_read(ws.keeper, asio::buffer(body), tuple_awaitable); ec) co_return std::nullopt;
  co_return parse_keeper_status(body);
}

asio::awaitable<void> keep_workspace(std::shared_ptr<Workspace> ws, SpawnerLink& link, egress::Service& egress,
                                     std::function<void(Workspace&)> gone) {
  const Policy& pol = *ws->policy;
  spawn::RunOrder order;
  order.policy = ws->one_shot ? session_policy_name(pol.name) : workspace_policy_name(pol.name);
  order.fingerprint = pol.fingerprint;
  order.mode = spawn::RunMode::Tool;  // the keeper (daemon/compile/spawn_policy.cc)
  order.timeout = pol.sessions.max_lifetime;
  order.venv = ws->venv;
  order.node_modules = ws->node_modules;
  std::shared_ptr<egress::RunProxy> proxy;
  if (pol.network == isolate::NetworkMode::Egress)
    proxy = std::make_shared<egress::RunProxy>(
        egress, pol.egress,
        ws->one_shot ? egress::RunLabels{ws->request_id, ws->organization_id, "session"}
                     : egress::RunLabels{"workspace:" + ws->name, ws->organization_id, "workspace"});
  struct StopProxy {
    const std::shared_ptr<egress::RunProxy>& proxy;
    ~StopProxy() {
      if (proxy) proxy->stop();
    }
  } stop_proxy{proxy};
  const auto t0 = std::chrono::steady_clock::now();
  auto take = [&](const std::string& run_id, std::vector<UniqueFd> fds) {
    ws->id = run_id;
    asio::error_code ec;
    ws->keeper.assign(asio::local::stream_protocol(), fds[0].get(), ec);
    if (ec) {  // (the event loop cannot watch one more descriptor)
      spdlog::error("workspace {}: its keeper cannot be reached: {}", run_id, ec.message());
      ws->end("daemon");
      return;
    }
    (void)fds[0].release();
    for (int i = 1; i <= 2; ++i) asio::co_spawn(ws->keeper.get_executor(), log_keeper_output(ws, std::move(fds[i])), asio::detached);
    ws->started = true;
    ws->last_used = std::chrono::steady_clock::now();
    ws->changed.cancel();
  };
  if (!ws->one_shot) asio::co_spawn(ws->keeper.get_executor(), expire(ws), asio::detached);
  LinkRun ran = co_await link.run(std::move(order), "", 0, 0, {}, ws->cancel, proxy.get(), {}, std::nullopt, 0, take);
  const std::string whose = ws->one_shot ? "the session" : "the workspace's sandbox";
  if (ran.refused)
    ws->refused = Refusal{refusal_code(ran.refused->code), whose + " could not start: " + ran.refused->message};
  else if (!ws->started)
    ws->refused = Refusal{ErrorCode::Internal, whose + " could not be set up: " +
                                                   (ran.result.error.empty() ? std::string("its log says why") : ran.result.error)};
  const auto reason = ran.result.reason;
  std::string ended_by = ws->ended_by;
  if (ended_by.empty())
    ended_by = reason == isolate::EndReason::Timeout     ? "lifetime"
               : reason == isolate::EndReason::Cancelled ? "daemon"
               : reason == isolate::EndReason::Exited || reason == isolate::EndReason::Signaled ? "keeper"
                                                                                               : "limit";
  ws->ended_by = ended_by;
  ws->result = std::move(ran.result);
  if (proxy) {
    proxy->stop();
    ws->egress = proxy->summary();
    ws->egress_audit = proxy->audit_fields();
  }
  ws->ended = true;
  asio::error_code ignored;
  ws->keeper.close(ignored);
  gone(*ws);
  ws->changed.cancel();
  if (ran.refused || !ws->started || ws->one_shot) co_return;
  const auto ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  spdlog::info(
      "audit workspace workspace_id={} org={} name={} policy={} policy_fingerprint={} sessions={} duration_ms={:.1f} "
      "ended_by={} end_reason={} cpu_ms={:.1f} peak_memory_bytes={}{}",
      ws->id, quoted_for_message(ws->organization_id), quoted_for_message(ws->name), quoted_for_message(pol.name),
      pol.fingerprint, ws->sessions, ms, ended_by, isolate::to_string(reason),
      std::chrono::duration<double, std::milli>(ws->result.cpu).count(), ws->result.peak_memory_bytes, ws->egress_audit);
}

}  // namespace tsb::core
