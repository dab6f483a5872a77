// toolsandboxd's server: a Unix stream socket, protocol v1, one coroutine
// per connection on a single-threaded io_context. Children are watched
// through pidfds (isolate/supervise.h); there is no SIGCHLD handler.
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
#include <set>
#include <string>

#include "daemon/core/config.h"
#include "daemon/core/registry.h"
#include "isolate/engine.h"
#include "protocol/messages.h"

namespace tsb::core {

class E2BBackend;

struct Peer {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

class Server {
 public:
  Server(asio::io_context& io, std::string config_path, DaemonConfig cfg, std::unique_ptr<isolate::Engine> engine,
         std::shared_ptr<const PolicySet> policies);
  ~Server();

  // Adopt the socket systemd passed (socket activation) or bind our own.
  Status open_listener();
  // Start accepting and handling signals. Returns immediately.
  void start();
  // Exit status for main() once io.run() returns.
  int exit_code() const noexcept { return exit_code_; }

 private:
  using socket_t = asio::local::stream_protocol::socket;

  asio::awaitable<void> accept_loop();
  asio::awaitable<void> serve(socket_t sock);
  asio::awaitable<std::string> dispatch(const protocol::Request& req, const Peer& peer, socket_t& sock);
  asio::awaitable<std::string> run_local(const protocol::Request& req, const Peer& peer, socket_t& sock);
  asio::awaitable<void> signal_loop();
  asio::awaitable<void> shutdown_sequence();
  bool peer_allowed(const Peer& p) const;
  void reload();
  nlohmann::json status_json() const;

  // Concurrency: at most max_concurrent_runs run, at most max_queued_runs
  // wait; beyond that a request is answered `busy` at once.
  enum class Slot { Granted, Busy, ShuttingDown };
  asio::awaitable<Slot> acquire_slot();
  void release_slot();

  asio::io_context& io_;
  std::string config_path_;
  DaemonConfig cfg_;
  std::unique_ptr<isolate::Engine> engine_;
  std::shared_ptr<const PolicySet> policies_;
  std::string runner_path_;
  std::unique_ptr<asio::local::stream_protocol::acceptor> acceptor_;
  asio::signal_set signals_;
  bool owns_socket_file_ = false;

  unsigned in_flight_ = 0;
  struct Waiter {
    asio::steady_timer timer;
    bool granted = false;  // release_slot passed its slot to this waiter
    explicit Waiter(asio::io_context& io) : timer(io, std::chrono::steady_clock::time_point::max()) {}
  };
  std::deque<std::shared_ptr<Waiter>> waiters_;
  std::set<std::shared_ptr<isolate::Sandbox>> live_;
  bool shutting_down_ = false;
  int exit_code_ = 0;
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  std::map<std::string, std::uint64_t> totals_;  // end reason -> count
  std::uint64_t connections_ = 0;
  std::uint64_t rejected_busy_ = 0;
  std::unique_ptr<E2BBackend> e2b_;  // when an E2B API key file is configured (docs/E2B.md)
};

// Where the trusted tool runner lives on the host ("" when not found).
std::string find_runner(const std::string& configured);
inline constexpr const char* kRunnerSandboxPath = "/opt/toolsandbox/runner/toolsandbox_runner.py";

}  // namespace tsb::core
