// toolsandboxd's server, in the unprivileged front end: the listening Unix
// stream socket the spawner hands over, protocol v1, one coroutine per
// connection on a single-threaded io_context. Local runs go to the root
// spawner (daemon/frontend/local/spawner_link.h).
#pragma once

#include <sys/types.h>

#include <asio/awaitable.hpp>
#include <asio/io_context.hpp>
#include <asio/local/stream_protocol.hpp>
#include <asio/signal_set.hpp>
#include <asio/steady_timer.hpp>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "daemon/frontend/admission/fair_share.h"
#include "daemon/policy/config.h"
#include "daemon/frontend/local/local_backend.h"
#include "daemon/frontend/pipeline/pipeline.h"
#include "daemon/policy/registry.h"
#include "daemon/frontend/local/spawner_link.h"
#include "daemon/frontend/session/session.h"
#include "protocol/messages.h"

namespace tsb::core {

class E2BBackend;

// At most one log line per interval for an event that can repeat fast (an
// accept that fails, refusals under a flood), with the count left out.
class LogThrottle {
 public:
  explicit LogThrottle(std::chrono::steady_clock::duration interval) : interval_(interval) {}
  // True when this occurrence is to be logged; `suppressed` is then the
  // number of occurrences left out since the last line.
  bool admit(std::uint64_t* suppressed);

 private:
  std::chrono::steady_clock::duration interval_;
  std::chrono::steady_clock::time_point next_{};
  std::uint64_t left_out_ = 0;
};

class Server {
 public:
  Server(asio::io_context& io, std::string config_path, DaemonConfig cfg, std::unique_ptr<SpawnerLink> link,
         std::shared_ptr<const PolicySet> policies);
  ~Server();

  // Adopt the listening socket the spawner passed (its own, or systemd's),
  // and read the E2B API key from the descriptor it opened.
  Status open_listener(int listen_fd, UniqueFd e2b_key);
  // Start accepting and handling signals. Returns immediately.
  void start();
  // Exit status for main() once io.run() returns.
  int exit_code() const noexcept { return exit_code_; }

 private:
  using socket_t = asio::local::stream_protocol::socket;

  asio::awaitable<void> accept_loop();
  // Refusals at accept time: one error line, sent without blocking, then close.
  void refuse_now(socket_t& sock, const std::string& line);
  // What closes a connection that gives its place up to another peer
  // (FairShare): its socket's pending read is cancelled.
  struct ConnState {
    socket_t* sock = nullptr;
  };
  asio::awaitable<void> serve(socket_t sock, Peer peer, std::unique_ptr<PeerConn> conn, std::shared_ptr<ConnState> state);
  // Reads one request line into `buf` within request_timeout, drawing on the
  // budget. Returns its length (before the '\n'), or nothing when the
  // connection is to be closed after *closing (if not empty) is sent.
  struct LineBuffer;
  asio::awaitable<std::optional<std::size_t>> read_line(socket_t& sock, LineBuffer& buf, PeerConn& hold, std::string* closing);
  // Why a connection was refused or closed for what its peer holds
  // (FairShare), for its closing line.
  std::string share_words(uid_t uid) const;
  // Writes within write_timeout; false when the peer did not take it in time
  // or the connection failed: the caller then closes.
  asio::awaitable<bool> write_line(socket_t& sock, const std::string& line);
  asio::awaitable<std::string> dispatch(const protocol::Request& req, const Peer& peer, socket_t& sock);
  // execute / run_tool: admission, the pipeline (daemon/frontend/pipeline/pipeline.h)
  // on the backend the placement names, the client watched meanwhile.
  asio::awaitable<std::string> run_request(const protocol::Request& req, const Peer& peer, socket_t& sock);
  // session: placed and checked here, then relayed (daemon/frontend/session/)
  // until it ends; a refusal's line, or "" (everything was sent).
  // `early_input`: what the client sent after the request line.
  asio::awaitable<std::string> session_request(const std::string& id, const protocol::SessionRequest& req,
                                               const Peer& peer, socket_t& sock, std::string early_input);
  asio::awaitable<void> signal_loop();
  asio::awaitable<void> shutdown_sequence();
  bool peer_allowed(const Peer& p) const;
  // The spawner reloaded (SIGHUP goes to it): this side's configuration,
  // policies (from the compile helper's record) and E2B key (its new
  // file's descriptor) follow.
  void reload(UniqueFd sources, UniqueFd e2b_key);
  void notify_ready(std::string_view status);
  // `warm_pool`: the spawner's answer (LocalBackend::warm_status).
  nlohmann::json status_json(nlohmann::json warm_pool) const;
  // status "fairness": the peers and their shares.
  nlohmann::json fairness_json() const;

  // Completes only when the peer has closed its end entirely (true), or
  // when cancelled (false).
  asio::awaitable<bool> wait_for_hangup(socket_t& sock);

  asio::io_context& io_;
  std::string config_path_;
  DaemonConfig cfg_;
  std::unique_ptr<SpawnerLink> link_;
  // The connections, request bytes, run slots and queue, shared by peers.
  FairShare shares_;
  std::unique_ptr<LocalBackend> local_;
  std::unique_ptr<Sessions> sessions_;
  std::shared_ptr<const PolicySet> policies_;
  std::string runner_path_;
  std::unique_ptr<asio::local::stream_protocol::acceptor> acceptor_;
  asio::signal_set signals_;

  bool shutting_down_ = false;
  int exit_code_ = 0;
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  std::map<std::string, std::uint64_t> totals_;  // end reason -> count
  std::uint64_t connections_ = 0;
  std::uint64_t rejected_busy_ = 0;
  unsigned connections_open_ = 0;
  std::uint64_t refused_connections_ = 0;  // over max_connections
  std::uint64_t refused_budget_ = 0;       // over max_buffered_bytes
  std::uint64_t write_timeouts_ = 0;
  std::uint64_t accept_errors_ = 0;
  LogThrottle accept_log_{std::chrono::seconds(5)};
  // One throttle per kind of event, so that a flood of one cannot hide
  // the others: at most one line per 5 s each, with the count left out.
  LogThrottle refusal_log_{std::chrono::seconds(5)};       // over max_connections
  LogThrottle unauthorized_log_{std::chrono::seconds(5)};  // peers not allowed
  LogThrottle write_timeout_log_{std::chrono::seconds(5)};
  LogThrottle budget_log_{std::chrono::seconds(5)};        // over max_buffered_bytes
  // Open connections, closed at shutdown before the event loop stops (their
  // coroutines hold budget and counters of this object).
  std::set<socket_t*> open_sockets_;
  std::unique_ptr<E2BBackend> e2b_;  // when an E2B API key file is configured (docs/E2B.md)
};


}  // namespace tsb::core
