#include "daemon/frontend/server.h"
#include "daemon/frontend/session/packages.h"

#include <malloc.h>
#include <spdlog/spdlog.h>
#include <poll.h>
#include <sys/resource.h>
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
#include <cstdlib>
#include <sstream>

#include "daemon/frontend/e2b/e2b.h"
#include "isolate/base/file.h"
#include "daemon/frontend/letta/result.h"
#include "protocol/record.h"
#include "daemon/policy/units.h"
#include "daemon/common/hash.h"
#include "daemon/policy/jsonc.h"
#include "daemon/policy/sources.h"
#include "isolate/supervise/supervise.h"
#include "daemon/frontend/letta/letta.h"
#include "daemon/compile/spawn_policy.h"

namespace tsb::core {
namespace {

using asio::use_awaitable;
using nlohmann::json;
using protocol::ErrorCode;
using namespace asio::experimental::awaitable_operators;
constexpr auto tuple_awaitable = asio::experimental::as_tuple(use_awaitable);

std::string q(std::string_view s) { return quoted_for_message(s); }

#ifndef SO_PEERGROUPS
#define SO_PEERGROUPS 59  // Linux 4.13, include/uapi/asm-generic/socket.h
#endif

// Supplementary groups from /proc/<pid>/status: only for kernels without
// SO_PEERGROUPS. Racy: the peer may have changed its groups since connect(),
// or exited and had its pid reused.
std::vector<gid_t> peer_groups_from_proc(pid_t pid) {
  std::vector<gid_t> out;
  auto text = read_file("/proc/" + std::to_string(pid) + "/status", {.max_bytes = 1u << 20});
  if (!text.ok()) return out;
  std::istringstream in(*text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Groups:", 0) != 0) continue;
    std::istringstream s(line.substr(7));
    gid_t g;
    while (s >> g) out.push_back(g);
  }
  return out;
}

// The supplementary groups the kernel recorded when the peer called
// connect(), as SO_PEERCRED does for uid and gid (socket(7)): what the peer
// does afterwards cannot change them. Empty when they cannot be read, which
// only ever refuses.
std::vector<gid_t> peer_groups(int fd, pid_t pid) {
  std::vector<gid_t> g(32);
  for (;;) {
    socklen_t len = static_cast<socklen_t>(g.size() * sizeof(gid_t));
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, g.data(), &len) == 0) {
      g.resize(len / sizeof(gid_t));
      return g;
    }
    if (errno == ERANGE && len > g.size() * sizeof(gid_t)) {  // len is the size needed
      g.resize(len / sizeof(gid_t));
      continue;
    }
    if (errno == ENOPROTOOPT && pid > 0) return peer_groups_from_proc(pid);
    return {};
  }
}

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

// accept(2) errors that mean the process or the system is out of a resource
// (descriptors, socket buffers, memory): retrying at once fails again.
bool accept_out_of_resources(const asio::error_code& ec) {
  if (ec.category() != asio::system_category()) return false;
  return ec.value() == EMFILE || ec.value() == ENFILE || ec.value() == ENOBUFS || ec.value() == ENOMEM;
}

std::string open_files_limit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return "unknown";
  return std::to_string(rl.rlim_cur);
}

// True when the peer has closed its end entirely (POLLHUP). A half-close
// (shutdown(SHUT_WR) after the request) shows as POLLRDHUP only: that
// client still waits for its answer.
bool peer_hung_up(int fd) {
  pollfd pfd{fd, POLLIN | POLLRDHUP, 0};
  return ::poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLHUP | POLLERR));
}

// Reads of one request line are at most this big; the buffer grows by
// doubling up to max_frame_bytes + 1.
constexpr std::size_t kReadChunk = 256u << 10;
// After a connection held more than this, free memory is handed back to the
// kernel (malloc_trim): the pages of a big request's parsed form are
// scattered through the heap, below live data, where free() cannot return them.
constexpr std::size_t kTrimAfterBytes = 1u << 20;

PoolLimits pool_limits(const DaemonConfig& c) {
  return PoolLimits{.buffered_bytes = c.max_buffered_bytes,
                    .byte_floor = c.max_frame_bytes,
                    .allowance = kConnectionAllowance,
                    .connections = c.max_connections,
                    .running = c.max_concurrent_runs,
                    .queued = c.max_queued_runs};
}

}  // namespace

bool LogThrottle::admit(std::uint64_t* suppressed) {
  auto now = std::chrono::steady_clock::now();
  if (now < next_) {
    ++left_out_;
    return false;
  }
  next_ = now + interval_;
  *suppressed = left_out_;
  left_out_ = 0;
  return true;
}

// One connection's unread request bytes. malloc/realloc rather than a
// std::string: glibc grows a large (mmap'ed) block with mremap, so growing
// copies nothing and touches only the pages that data lands in, and a
// decoded frame's memory goes back to the kernel at once (consume()).
struct Server::LineBuffer {
  LineBuffer() = default;
  LineBuffer(const LineBuffer&) = delete;
  LineBuffer& operator=(const LineBuffer&) = delete;
  ~LineBuffer() { std::free(data); }

  // Room for n bytes in all; false when memory is short.
  bool reserve(std::size_t n, std::size_t cap_limit) {
    if (n <= capacity) return true;
    std::size_t c = std::max(n, std::min(std::max<std::size_t>(capacity * 2, kReadChunk), cap_limit));
    void* p = std::realloc(data, c);
    if (!p) return false;
    data = static_cast<char*>(p);
    capacity = c;
    return true;
  }
  // Drops the first n bytes (a frame and its newline). What follows (the
  // start of a pipelined request, at most one read) moves to a small block
  // of its own; the big one is freed.
  void consume(std::size_t n) {
    std::size_t rest = size - n;
    char* p = rest ? static_cast<char*>(std::malloc(rest)) : nullptr;
    if (rest && !p) {  // keep the big block rather than lose the bytes
      std::memmove(data, data + n, rest);
      size = rest;
      return;
    }
    if (rest) std::memcpy(p, data + n, rest);
    std::free(data);
    data = p;
    size = capacity = rest;
  }

  char* data = nullptr;
  std::size_t size = 0;
  std::size_t capacity = 0;
};

Server::Server(asio::io_context& io, std::string config_path, DaemonConfig cfg, std::unique_ptr<SpawnerLink> link,
               std::shared_ptr<const PolicySet> policies)
    : io_(io),
      config_path_(std::move(config_path)),
      cfg_(std::move(cfg)),
      link_(std::move(link)),
      shares_(pool_limits(cfg_)),
      local_(std::make_unique<LocalBackend>(io, *link_, shares_)),
      policies_(std::move(policies)),
      signals_(io, SIGTERM, SIGINT) {
  runner_path_ = find_runner(cfg_.runner_path);
  // Only if some policy installs packages: otherwise no cache is needed.
  if (std::any_of(policies_->policies.begin(), policies_->policies.end(),
                  [](const auto& kv) { return kv.second->packages.enabled || kv.second->npm_packages.enabled; }))
    local_->open_venv_cache(cfg_.venvs.cache_dir, cfg_.venvs.max_bytes);
  if (cfg_.e2b.enabled) e2b_ = std::make_unique<E2BBackend>(io_, cfg_.e2b);
  // A peer's first connection or its last one changes every share: runs
  // queued past the old share may start.
  shares_.on_peers_changed = [this] { local_->shares_changed(); };
  sessions_ = std::make_unique<Sessions>(io_, *link_, local_->egress_service(), *local_);
  sessions_->set_limits({cfg_.max_sessions, cfg_.max_sessions_per_organization});
  link_->on_reload = [this](bool applied, UniqueFd sources, UniqueFd key) {
    if (applied) return reload(std::move(sources), std::move(key));
    // The spawner kept its set (its log says why): so does this side, and
    // the two stay the same set.
    spdlog::error("reload: the spawner kept the configuration and policies in force; so does the front end");
    notify_ready("");
  };
}

Server::~Server() = default;

Status Server::open_listener(int listen_fd, UniqueFd e2b_key) {
  // The E2B API key is read before anything is served: a key file others
  // can read stops the daemon here. The spawner opened it (as root); this
  // process reads and checks it.
  if (e2b_)
    if (auto st = e2b_->load_key(std::move(e2b_key)); !st.ok()) return st;
  if (sd_is_socket_unix(listen_fd, SOCK_STREAM, 1, nullptr, 0) <= 0)
    return Error::invalid("descriptor " + std::to_string(listen_fd) + " is not a listening Unix stream socket");
  acceptor_ = std::make_unique<asio::local::stream_protocol::acceptor>(io_);
  asio::error_code ec;
  acceptor_->assign(asio::local::stream_protocol(), listen_fd, ec);
  if (ec) return Error::invalid("adopting the listening socket: " + ec.message());
  return {};
}

void Server::notify_ready(std::string_view status) { link_->notify_ready(status); }

void Server::start() {
  asio::co_spawn(io_, accept_loop(), asio::detached);
  asio::co_spawn(io_, signal_loop(), asio::detached);
  link_->start();
  if (runner_path_.empty())
    spdlog::warn("the tool runner was not found (set \"runner\" in the configuration): run_tool requests will fail");
  notify_ready("accepting requests");
}

bool Server::peer_allowed(const Peer& p) const {
  for (uid_t u : cfg_.allowed_uids)
    if (u == p.uid) return true;
  if (cfg_.allowed_gids.empty()) return false;
  for (gid_t g : cfg_.allowed_gids)
    if (g == p.gid) return true;
  for (gid_t pg : p.groups)
    for (gid_t g : cfg_.allowed_gids)
      if (g == pg) return true;
  return false;
}

asio::awaitable<void> Server::accept_loop() {
  // Out of descriptors (EMFILE), the listener stays readable and accept()
  // fails at once, forever: retrying without a pause spins and floods the
  // log. Pause instead, longer each time up to a second, and log at most
  // once per interval. Waiting connections stay in the listen backlog.
  constexpr std::chrono::milliseconds kMinPause{50}, kMaxPause{1000};
  std::chrono::milliseconds pause = kMinPause;
  asio::steady_timer pause_timer(io_);
  for (;;) {
    auto [ec, sock] = co_await acceptor_->async_accept(tuple_awaitable);
    if (ec) {
      if (shutting_down_ || ec == asio::error::operation_aborted) co_return;
      ++accept_errors_;
      if (ec == asio::error::connection_aborted) continue;  // that peer is gone; the next one may wait
      const bool resources = accept_out_of_resources(ec);
      std::uint64_t left_out = 0;
      if (accept_log_.admit(&left_out))
        spdlog::warn("accept: {}{}; pausing accepts for {} ms ({} similar messages left out)", ec.message(),
                     ec.value() == EMFILE ? " (open files limit " + open_files_limit() + ")" : std::string(),
                     pause.count(), left_out);
      pause_timer.expires_after(pause);
      co_await pause_timer.async_wait(tuple_awaitable);
      pause = resources ? std::min(pause * 2, kMaxPause) : kMinPause;
      continue;
    }
    pause = kMinPause;
    ++connections_;
    // The peer check and the connection cap come before anything is read;
    // both refusals are one line, written without waiting, then close.
    Peer peer = peer_of(sock.native_handle());
    if (!cfg_.allowed_gids.empty()) peer.groups = peer_groups(sock.native_handle(), peer.pid);
    if (!peer_allowed(peer)) {
      std::uint64_t left_out = 0;
      if (unauthorized_log_.admit(&left_out))
        spdlog::warn("refused peer uid={} gid={} pid={}: not allowed ({} similar messages left out)", peer.uid,
                     peer.gid, peer.pid, left_out);
      refuse_now(sock, protocol::encode_error("", ErrorCode::Unauthorized,
                                              "uid " + std::to_string(peer.uid) + " is not allowed to use this daemon"));
      continue;
    }
    // The connection's place among max_connections, by peer: refused when
    // they are all taken and this peer holds its share (or no peer holds
    // more than its own); a peer over its share may give one up for it.
    auto state = std::make_shared<ConnState>();
    std::unique_ptr<PeerConn> conn = shares_.open(peer.uid, [state] {
      asio::error_code ignored;
      if (state->sock) state->sock->cancel(ignored);
    });
    if (!conn) {
      ++refused_connections_;
      std::uint64_t left_out = 0;
      if (refusal_log_.admit(&left_out))
        spdlog::warn("refused a connection of uid={} pid={}: {} connections open (max_connections), {} of this peer "
                     "({} similar messages left out)",
                     peer.uid, peer.pid, shares_.connections(), shares_.connections(peer.uid), left_out);
      refuse_now(sock, protocol::encode_error("", ErrorCode::Busy,
                                              "too many connections open (" + std::to_string(shares_.connections()) +
                                                  ", max_connections; " + share_words(peer.uid) +
                                                  "); retry later; closing"));
      continue;
    }
    ++connections_open_;
    asio::co_spawn(io_, serve(std::move(sock), std::move(peer), std::move(conn), std::move(state)), asio::detached);
  }
}

std::string Server::share_words(uid_t uid) const {
  const PoolLimits& l = shares_.limits();
  return "peer uid " + std::to_string(uid) + " holds " + std::to_string(shares_.connections(uid)) + " connections and " +
         format_size(shares_.charged(uid)) + " of request data; its share is " +
         std::to_string(shares_.connection_share()) + " of max_connections " + std::to_string(l.connections) + " and " +
         format_size(shares_.byte_share()) + " of max_buffered_bytes " + format_size(l.buffered_bytes) +
         ", shared by " + std::to_string(shares_.peers()) + (shares_.peers() == 1 ? " peer" : " peers");
}

void Server::refuse_now(socket_t& sock, const std::string& line) {
  // A fresh connection's send buffer is empty: a short line always fits,
  // and MSG_DONTWAIT makes sure nothing here ever blocks.
  (void)!::send(sock.native_handle(), line.data(), line.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  asio::error_code ignored;
  sock.close(ignored);
}

asio::awaitable<bool> Server::write_line(socket_t& sock, const std::string& line) {
  asio::steady_timer deadline(io_, cfg_.write_timeout);
  auto res = co_await (asio::async_write(sock, asio::buffer(line), tuple_awaitable) || deadline.async_wait(tuple_awaitable));
  if (res.index() == 1) {
    ++write_timeouts_;
    std::uint64_t left_out = 0;
    if (write_timeout_log_.admit(&left_out))
      spdlog::warn("dropped an answer of {} bytes: the client did not read it within {} (write_timeout); closing "
                   "({} similar messages left out)",
                   line.size(), format_duration(cfg_.write_timeout), left_out);
    co_return false;
  }
  auto [ec, n] = std::get<0>(res);
  co_return !ec;
}

asio::awaitable<std::optional<std::size_t>> Server::read_line(socket_t& sock, LineBuffer& buf, PeerConn& hold, std::string* closing) {
  closing->clear();
  // One deadline for the whole line, from the moment the daemon starts
  // waiting for it: a line trickled in byte by byte is bounded too, and so
  // is an idle connection.
  asio::steady_timer deadline(io_, cfg_.request_timeout);
  const std::size_t cap = cfg_.max_frame_bytes + 1;  // never more of one request than this
  std::size_t scanned = 0;
  for (;;) {
    // The frame cap is enforced while reading, before any parsing.
    if (const void* nl = buf.size > scanned ? std::memchr(buf.data + scanned, '\n', buf.size - scanned) : nullptr) {
      std::size_t len = static_cast<const char*>(nl) - buf.data;
      if (len > cfg_.max_frame_bytes) break;  // too large
      co_return len;
    }
    scanned = buf.size;
    if (buf.size >= cap) break;  // too large
    std::size_t want = std::min(kReadChunk, cap - buf.size);
    // Reads within the connection's own allowance stay within it: a
    // connection waiting for a small request (a status poll) must not hold a
    // whole chunk of the shared budget meanwhile, which refused another
    // connection's maximal line whenever the two overlapped.
    if (hold.bytes() < kConnectionAllowance) want = std::min(want, kConnectionAllowance - hold.bytes());
    PeerConn::Take took = hold.try_take(want);
    if (took != PeerConn::Take::Taken) {
      // With the budget spent, a read still fits in what is left of this
      // connection's own allowance, which needs no budget: a small request
      // is served all the same.
      const std::size_t small = std::min(want, kConnectionAllowance - std::min(kConnectionAllowance, hold.bytes()));
      if (small > 0 && hold.try_take(small) == PeerConn::Take::Taken) {
        want = small;
        took = PeerConn::Take::Taken;
      }
    }
    if (hold.gave_up() != PeerConn::GaveUp::No) break;
    if (took != PeerConn::Take::Taken) {
      ++refused_budget_;
      std::uint64_t left_out = 0;
      if (budget_log_.admit(&left_out))
        spdlog::warn("refused a request of uid={}: {} bytes buffered for all connections, max_buffered_bytes is {}, "
                     "{} charged to this peer, its share {} ({} similar messages left out)",
                     hold.uid(), shares_.held(), shares_.limits().buffered_bytes, shares_.charged(hold.uid()),
                     shares_.byte_share(), left_out);
      // A peer alone (or every peer within its share) is told the daemon
      // is full; a peer over its share, that it is.
      const bool share = took == PeerConn::Take::OverShare && shares_.peers() > 1;
      *closing = protocol::encode_error(
          "", ErrorCode::Busy,
          (share ? "this peer holds its share of the request data the daemon buffers (" + share_words(hold.uid()) + ")"
                 : "the daemon holds too much request data (max_buffered_bytes " +
                       format_size(shares_.limits().buffered_bytes) + ")") +
              "; retry later; closing");
      co_return std::nullopt;
    }
    if (!buf.reserve(buf.size + want, cap)) {
      hold.release(want);
      *closing = protocol::encode_error("", ErrorCode::Internal, "out of memory reading the request; closing");
      co_return std::nullopt;
    }
    auto res = co_await (sock.async_read_some(asio::buffer(buf.data + buf.size, want), tuple_awaitable) ||
                         deadline.async_wait(tuple_awaitable));
    if (res.index() == 1) {
      hold.release(want);
      *closing = protocol::encode_error(
          "", ErrorCode::Timeout, "no complete request line within " + format_duration(cfg_.request_timeout) + "; closing");
      co_return std::nullopt;
    }
    auto [ec, n] = std::get<0>(res);
    hold.release(want - n);
    buf.size += n;
    if (hold.gave_up() != PeerConn::GaveUp::No) break;  // its read was cancelled
    if (ec) {
      if (ec == asio::error::eof && buf.size > 0)
        *closing = protocol::encode_error("", ErrorCode::BadRequest, "connection closed in the middle of a request line");
      co_return std::nullopt;  // eof between requests, reset, ...: just close
    }
  }
  if (hold.gave_up() != PeerConn::GaveUp::No) {
    // Its place went to another peer's connection or request line: what it
    // held is given back already.
    *closing = protocol::encode_error(
        "", ErrorCode::Busy,
        std::string(hold.gave_up() == PeerConn::GaveUp::Connection
                        ? "this connection gave its place up to another peer's: max_connections were all open"
                        : "this request line gave its place up to another peer's: max_buffered_bytes was full") +
            ", and this peer held more than its share (" + share_words(hold.uid()) + "); retry later; closing");
    co_return std::nullopt;
  }
  *closing = protocol::encode_error("", ErrorCode::TooLarge, "request larger than " + format_size(cfg_.max_frame_bytes) + "; closing");
  co_return std::nullopt;
}

asio::awaitable<void> Server::serve(socket_t sock, Peer peer, std::unique_ptr<PeerConn> conn,
                                    std::shared_ptr<ConnState> state) {
  struct Open {
    Server* s;
    socket_t* sock;
    ConnState& state;
    ~Open() {
      --s->connections_open_;
      s->open_sockets_.erase(sock);
      state.sock = nullptr;
    }
  } open{this, &sock, *state};
  open_sockets_.insert(&sock);
  state->sock = &sock;
  // Everything this connection holds is charged to the budget, until it
  // ends: the line being read, the request being handled (its decoded form
  // and the sandbox's stdin are about the size of the line), the answer
  // being written. Past the budget, new request bytes are refused; answers
  // of runs that happened are never refused, and they are bounded by the
  // runs (slots and queue). The budget is shared by peers (FairShare).
  PeerConn& hold = *conn;
  LineBuffer buf;
  // One bad peer must never take the daemon down: everything is caught here.
  try {
    for (;;) {
      if (shutting_down_) {
        co_await write_line(sock, protocol::encode_error("", ErrorCode::Unavailable, "the daemon is shutting down"));
        co_return;
      }
      std::string closing;
      // While it reads a request, the connection holds nothing of a run:
      // it may give its place up to another peer's.
      hold.set_reading(true);
      std::optional<std::size_t> line = co_await read_line(sock, buf, hold, &closing);
      hold.set_reading(false);
      if (!line) {
        // What was read is given back before the last line goes out: a
        // peer that does not read it must not keep the budget meanwhile.
        hold.release(buf.size);
        buf.consume(buf.size);
        if (!closing.empty()) co_await write_line(sock, closing);
        co_return;
      }
      const std::size_t len = *line;
      std::size_t peak = hold.bytes();
      {
        std::string_view frame(buf.data, len);
        if (!frame.empty() && frame.back() == '\r') frame.remove_suffix(1);
        std::string id;
        auto decoded = protocol::decode_request(frame, &id);
        // The line is no longer needed once decoded: its memory goes back
        // now, before a run that may take minutes. The request itself stays
        // charged (len bytes) until its answer is out.
        buf.consume(len + 1);
        hold.release(1);
        std::string reply;
        if (auto* perr = std::get_if<protocol::ProtocolError>(&decoded)) {
          reply = protocol::encode_error(id, perr->code, perr->message);
        } else if (auto* sr = std::get_if<protocol::SessionRequest>(&std::get<protocol::Request>(decoded).body)) {
          // A session has the connection to itself until it ends, and then
          // the connection closes (a refusal is its one line).
          // What came after the request line is the start of the command's stdin.
          std::string early(buf.data, buf.size);
          hold.release(buf.size);
          buf.consume(buf.size);
          reply = co_await session_request(std::get<protocol::Request>(decoded).id, *sr, peer, sock, std::move(early));
          if (!reply.empty()) co_await write_line(sock, reply);
          hold.release(len);
          co_return;
        } else {
          reply = co_await dispatch(std::get<protocol::Request>(decoded), peer, sock);
        }
        hold.take(reply.size());
        peak = std::max(peak, hold.bytes());
        bool written = co_await write_line(sock, reply);
        hold.release(reply.size() + len);
        if (!written) co_return;
      }
      if (peak > kTrimAfterBytes) ::malloc_trim(0);
    }
  } catch (const std::exception& e) {
    spdlog::error("connection handler: {}", e.what());
  }
}

asio::awaitable<std::string> Server::dispatch(const protocol::Request& req, const Peer& peer, socket_t& sock) {
  if (std::holds_alternative<protocol::StatusRequest>(req.body))
    co_return protocol::encode_ok(req.id, "status", status_json(co_await local_->warm_status()));
  const bool listing = std::holds_alternative<protocol::SessionListRequest>(req.body);
  if (const auto* kill = std::get_if<protocol::SessionKillRequest>(&req.body); kill && kill->signal) {
    // A signal for a session's command: its own client's, or the operator's.
    if (!sessions_->signal(kill->session_id, *kill->signal, peer.uid))
      co_return protocol::encode_error(req.id, ErrorCode::BadRequest,
                                       "no open session " + q(kill->session_id) + " of this client runs a command now");
    json answer = {{"v", protocol::kProtocolVersion}, {"id", req.id}, {"ok", true}, {"killed", kill->session_id},
                   {"signal", protocol::session_signal_name(*kill->signal)}};
    co_return answer.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  }
  if (const auto* kill = std::get_if<protocol::SessionKillRequest>(&req.body); kill || listing) {
    // The operator's: another client's sessions are none of a client's business.
    if (peer.uid != 0)
      co_return protocol::encode_error(req.id, ErrorCode::Unauthorized,
                                       std::string(req.type_name()) + " is for uid 0 (the operator)");
    if (listing) {
      json answer = {{"v", protocol::kProtocolVersion}, {"id", req.id}, {"ok", true},
                     {"sessions", sessions_->list()}, {"workspaces", sessions_->list_workspaces()}};
      co_return answer.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
    }
    if (!sessions_->kill(kill->session_id))
      co_return protocol::encode_error(req.id, ErrorCode::BadRequest,
                                       "no open session or kept workspace " + q(kill->session_id));
    co_return protocol::encode_ok(req.id, "killed", kill->session_id);
  }
  co_return co_await run_request(req, peer, sock);
}

asio::awaitable<bool> Server::wait_for_hangup(socket_t& sock) {
  // Readable is cheap to wait for, but a socket with a pipelined request or
  // a half-closed one (which still waits for its answer) is readable
  // without having hung up, and stays so; from then on, look every 200 ms.
  auto [ec] = co_await sock.async_wait(socket_t::wait_read, tuple_awaitable);
  if (ec == asio::error::operation_aborted) co_return false;
  asio::steady_timer tick(io_);
  for (;;) {
    if (peer_hung_up(sock.native_handle())) co_return true;
    tick.expires_after(std::chrono::milliseconds(200));
    auto [tec] = co_await tick.async_wait(tuple_awaitable);
    if (tec == asio::error::operation_aborted) co_return false;
  }
}

asio::awaitable<std::string> Server::run_request(const protocol::Request& req, const Peer& peer, socket_t& sock) {
  // Admission: nothing new starts while the daemon stops, or while answers
  // waiting for clients that do not read them fill the budget (they are
  // never refused: their run happened). Meanwhile what is held stays below
  // the budget plus one answer per run in flight; the client is told why.
  if (shutting_down_) co_return protocol::encode_error(req.id, ErrorCode::Unavailable, "the daemon is shutting down");
  if (shares_.charged(peer.uid) >= shares_.byte_share()) {
    ++rejected_busy_;
    co_return protocol::encode_error(
        req.id, ErrorCode::Busy,
        shares_.peers() == 1
            ? "answers not yet read by their clients fill max_buffered_bytes (" +
                  format_size(shares_.limits().buffered_bytes) + "); retry later"
            : "answers not yet read by this peer's connections fill its share of max_buffered_bytes (" +
                  share_words(peer.uid) + "); retry later");
  }

  PreparedRun p;
  const int fd = sock.native_handle();
  p.client_gone = [fd] { return peer_hung_up(fd); };
  const Backends backends{local_.get(), cfg_.e2b.enabled ? e2b_.get() : nullptr, cfg_.e2b.enabled};
  if (auto refused = prepare_run(req, peer, policies_, backends, runner_path_, p))
    co_return protocol::encode_error(req.id, refused->code, refused->message);
  // E2B runs take no local run slot; E2BConfig.max_sandboxes bounds them.
  RunBackend* backend = p.backend;

  // The backend runs while the connection is watched: a client that goes
  // away (a full close; a half-close still waits for its answer) cancels
  // the run, queued or running.
  const auto t0 = std::chrono::steady_clock::now();
  BackendRun out;
  bool done = false;
  asio::steady_timer stop(io_, std::chrono::steady_clock::time_point::max());
  auto run_it = [&]() -> asio::awaitable<void> {
    // However the backend ends (an exception too), the watch is released.
    struct Release {
      bool& done;
      asio::steady_timer& stop;
      ~Release() {
        done = true;
        stop.cancel();
      }
    } release{done, stop};
    try {
      out = co_await backend->run(p);
    } catch (const std::exception& e) {
      // A backend's bug ends this run with an answer, not the connection
      // without one.
      spdlog::error("{} backend: run of {} failed: {}", backend->name(), q(p.common->tool_name), e.what());
      out = BackendRun{};
      out.refused = Refusal{ErrorCode::Internal, "the run failed inside the daemon; its log says why"};
    }
  };
  auto watch = [&]() -> asio::awaitable<void> {
    // A backend that answers without waiting (busy, a refusal) is done
    // before this starts: the timer would then never be cancelled.
    if (done) co_return;
    auto r = co_await (stop.async_wait(tuple_awaitable) || wait_for_hangup(sock));
    if (r.index() == 1 && std::get<1>(r)) {
      p.cancel->request();
      if (!done) co_await stop.async_wait(tuple_awaitable);
    }
  };
  co_await (run_it() && watch());

  if (out.refused) {
    // E2B's own busy answers (all its sandboxes in use) are in e2b.counters.
    if (out.refused->code == ErrorCode::Busy && backend == local_.get()) ++rejected_busy_;
    co_return protocol::encode_error(req.id, out.refused->code, out.refused->message);
  }
  std::string ended;
  std::string line = finish_run(p, backend->name(), out, std::chrono::steady_clock::now() - t0, &ended);
  ++totals_[ended];
  out.held.reset();  // a local run's slot: only now, so that status counts the run before it frees it
  co_return line;
}

asio::awaitable<std::string> Server::session_request(const std::string& id, const protocol::SessionRequest& req,
                                                     const Peer& peer, socket_t& sock, std::string early_input) {
  using protocol::ErrorCode;
  if (shutting_down_) co_return protocol::encode_error(id, ErrorCode::Unavailable, "the daemon is shutting down");
  auto placement = place_run(*policies_, req.organization_id, req.policy, cfg_.e2b.enabled);
  if (!placement.ok()) co_return protocol::encode_error(id, ErrorCode::PolicyDenied, placement.error().message);
  const Policy& pol = *placement->policy;
  if (placement->backend != Backend::Local)
    co_return protocol::encode_error(id, ErrorCode::PolicyDenied,
                                     "sessions run on this host only, and organization " + q(req.organization_id) +
                                         " is placed on E2B");
  if (!pol.sessions.enabled)
    co_return protocol::encode_error(id, ErrorCode::PolicyDenied,
                                     "policy " + q(pol.name) + " has no \"sessions\": it opens none");
  if (cfg_.max_sessions == 0)
    co_return protocol::encode_error(id, ErrorCode::PolicyDenied, "this daemon opens no sessions (max_sessions is 0)");
  SessionOpen open;
  open.argv = req.command;
  // `npx` and `uvx` are a command's own packages (session/packages.h): the
  // sessions resolve them.
  if (!is_package_launcher(req.command[0])) open.argv[0] = resolve_session_command(pol.sessions, req.command[0]);
  if (open.argv[0].empty()) {
    std::string allowed;
    for (const std::string& c : pol.sessions.commands) allowed += (allowed.empty() ? "" : ", ") + c;
    co_return protocol::encode_error(id, ErrorCode::PolicyDenied,
                                     "policy " + q(pol.name) + " does not allow the command " + q(req.command[0]) +
                                         " in sessions (it allows: " + allowed + ")");
  }
  if (auto env = build_environment(pol, req.env); !env.ok())
    co_return protocol::encode_error(id, ErrorCode::PolicyDenied, env.error().message);
  if (req.workspace && !pol.sessions.workspace)
    co_return protocol::encode_error(id, ErrorCode::PolicyDenied,
                                     "policy " + q(pol.name) + " keeps no workspaces (its \"sessions\" has no \"workspace\")");
  open.workspace = req.workspace.value_or("");
  open.policy = placement->policy;
  open.env = req.env;
  open.request_id = id;
  open.organization_id = req.organization_id;
  open.agent_id = req.agent_id.value_or("");
  open.peer = peer;
  const int fd = sock.native_handle();
  open.client_gone = [fd] { return peer_hung_up(fd); };
  open.write_timeout = cfg_.write_timeout;
  open.early_input = std::move(early_input);
  auto refused = co_await sessions_->run(std::move(open), sock);
  co_return refused ? protocol::encode_error(id, refused->code, refused->message) : std::string();
}

json Server::fairness_json() const {
  // Each share as it is now (FairShare: max(pool / peers, floor)), and what
  // peers over their share gave up for others since start.
  json shares = {{"connections", shares_.connection_share()},
                 {"buffered_bytes", shares_.byte_share()},
                 {"runs", shares_.run_share()},
                 {"queued_runs", shares_.queue_share()}};
  json given_up = {{"connections", shares_.connections_given_up()},
                   {"request_lines", shares_.lines_given_up()},
                   {"queued_runs", shares_.queued_runs_given_up()}};
  return {{"peers", shares_.peers()}, {"shares", std::move(shares)}, {"given_up", std::move(given_up)}};
}

json Server::status_json(json warm_pool) const {
  json totals = json::object();
  for (const auto& [k, v] : totals_) totals[k] = v;
  json pols = json::object();
  for (const auto& [name, p] : policies_->policies) pols[name] = p->fingerprint;
  return {{"version", TSB_VERSION},
          {"uptime_s", std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count()},
          {"runs_in_flight", local_->in_flight()},
          {"runs_queued", local_->queued()},
          {"max_concurrent_runs", cfg_.max_concurrent_runs},
          {"max_queued_runs", cfg_.max_queued_runs},
          {"totals", totals},
          {"rejected_busy", rejected_busy_},
          {"connections", connections_},
          {"connections_open", connections_open_},
          {"max_connections", cfg_.max_connections},
          {"refused_connections", refused_connections_},
          {"refused_budget", refused_budget_},
          {"buffered_bytes", shares_.held()},
          {"fairness", fairness_json()},
          {"max_buffered_bytes", cfg_.max_buffered_bytes},
          {"write_timeouts", write_timeouts_},
          {"abandoned_in_queue", local_->abandoned_in_queue()},
          {"accept_errors", accept_errors_},
          {"cgroup_mode", link_->hello().cgroup_mode},
          {"engine", local_->engine_status()},
          {"egress", local_->egress_status()},
          {"venvs", local_->venv_status()},
          {"sessions", sessions_->status()},
          {"warm_pool", std::move(warm_pool)},
          {"policies", pols},
          {"e2b_configured", cfg_.e2b.enabled},
          {"e2b", e2b_ ? e2b_->status_json() : json()},
          {"shutting_down", shutting_down_}};
}

void Server::reload(UniqueFd sources, UniqueFd e2b_key) {
  // Called once the spawner's new set is in force, with the record of the
  // files the compile helper read for it: this side loads the same bytes.
  // A failure here (a record that cannot be read, an E2B key refused)
  // leaves the two on different sets. Said loudly: once the spawner drops
  // its previous set (after a minute, kPreviousSetLifetime), runs of a
  // policy that changed are refused until a reload both sides take.
  auto parted = [this](const std::string& why) {
    spdlog::critical("reload: keeping the current configuration and policies here, although the spawner took the "
                     "new ones: {}; runs of a policy that changed are refused a minute from now, until a reload "
                     "this side can follow",
                     why);
    notify_ready("");
  };
  if (!sources) return parted("the spawner sent no record of the files");
  auto files = read_source_record(sources.get());
  if (!files.ok()) return parted(files.error().message);
  auto cfg = load_daemon_config(config_path_, /*optional=*/false, &*files);
  if (!cfg.ok()) return parted(cfg.error().message);
  auto set = load_policy_set(*cfg, &*files);
  if (!set.ok()) {
    return parted(set.error().message);
  }
  // The E2B key is re-read (and its file checked) before anything changes.
  if (cfg->e2b.enabled) {
    if (!e2b_) e2b_ = std::make_unique<E2BBackend>(io_, cfg->e2b);
    if (auto st = e2b_->reconfigure(cfg->e2b, std::move(e2b_key)); !st.ok()) {
      return parted(st.error().message);
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
  // Connections already open stay; a lower max_connections only refuses
  // new ones. A larger max_concurrent_runs starts queued runs now; a
  // smaller one lets the runs in flight finish.
  shares_.set_limits(pool_limits(cfg_));
  local_->shares_changed();
  sessions_->set_limits({cfg_.max_sessions, cfg_.max_sessions_per_organization});
  // A policy that now installs packages: the cache opens (its place and cap
  // are read at start only, as the engine's settings).
  if (std::any_of(policies_->policies.begin(), policies_->policies.end(),
                  [](const auto& kv) { return kv.second->packages.enabled || kv.second->npm_packages.enabled; }))
    local_->open_venv_cache(cfg_.venvs.cache_dir, cfg_.venvs.max_bytes);
  for (const auto& [name, p] : policies_->policies) spdlog::info("policy {} {}", q(name), p->fingerprint);
  spdlog::info("reloaded configuration and {} policies", policies_->policies.size());
  notify_ready("");
}

asio::awaitable<void> Server::signal_loop() {
  for (;;) {
    auto [ec, sig] = co_await signals_.async_wait(tuple_awaitable);
    if (ec) co_return;
    spdlog::info("signal {}: stopping", sig);
    co_await shutdown_sequence();
    co_return;
  }
}

asio::awaitable<void> Server::shutdown_sequence() {
  shutting_down_ = true;
  asio::error_code ec;
  if (acceptor_) acceptor_->close(ec);
  // Queued requests will not start; sessions end now.
  local_->stop_taking_runs();
  sessions_->end_all();
  // In-flight runs may finish within the grace period, then are killed.
  auto deadline = std::chrono::steady_clock::now() + cfg_.shutdown_grace;
  if (e2b_) co_await e2b_->shutdown(cfg_.shutdown_grace);
  co_await local_->finish_runs(deadline);
  asio::steady_timer t(io_);
  // The sessions' ends (Kill at end_all) and their records, bounded.
  for (int i = 0; i < 500 && !sessions_->empty(); ++i) {
    t.expires_after(std::chrono::milliseconds(20));
    co_await t.async_wait(tuple_awaitable);
  }
  // Let the last responses go out, then close every connection (idle
  // clients wait in a read; a client that does not read, in a write) and
  // wait for their handlers to end: they hold budget and counters of this
  // Server, which must not outlive it in the event loop's queue.
  t.expires_after(std::chrono::milliseconds(100));
  co_await t.async_wait(tuple_awaitable);
  for (socket_t* s : std::vector<socket_t*>(open_sockets_.begin(), open_sockets_.end())) s->close(ec);
  for (int i = 0; i < 100 && connections_open_ > 0; ++i) {
    t.expires_after(std::chrono::milliseconds(20));
    co_await t.async_wait(tuple_awaitable);
  }
  if (connections_open_ > 0) spdlog::warn("{} connection handlers still open at exit", connections_open_);
  io_.stop();
}

}  // namespace tsb::core
