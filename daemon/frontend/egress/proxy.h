// The egress proxy: how a tool in network mode "egress" reaches what its
// policy allows, and nothing else (docs/SECURITY.md, "Egress").
//
// The sandbox has a network namespace of its own with only lo. Its init
// makes a listener on 127.0.0.1:3128 there and hands it over
// (isolate/engine/plan.h); the spawner passes it on with the run's pipes; here the front
// end, unprivileged, accepts on it. Each connection carries one proxy
// request (daemon/frontend/egress/request.h): CONNECT host:port, or a plain HTTP
// request in absolute form. For each:
//   1. the policy's rules are applied to the host as named (rules.h);
//   2. a name is resolved here, by the daemon (getaddrinfo, the host's
//      resolver), never by the tool;
//   3. every address is checked against the deny list (address.h), and
//      only an address that passes is connected to: the address checked is
//      the address used, so no DNS answer, rebinding or redirect reaches a
//      denied one (a redirect is a new request, checked anew);
//   4. the connection relays bytes both ways, counted against the run's
//      byte cap;
//   5. one audit line when it ends: run, host, port, address, bytes each
//      way, allowed or why refused.
// A refusal is an HTTP error to the tool whose reason phrase says why.
//
// Lifetime: a RunProxy lives as long as its run. stop() (the run ended)
// closes the listener and every connection. Everything runs on the front
// end's io_context thread; only name lookups use threads of their own.
#pragma once

#include <asio/awaitable.hpp>
#include <asio/io_context.hpp>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "daemon/frontend/egress/address.h"
#include "daemon/policy/policy.h"
#include "isolate/base/unique_fd.h"

namespace tsb::egress {

struct ProxyRequest;  // request.h

// Bounds of the whole daemon, whatever the policies say: connections open
// at once (each holds two descriptors), in all and per run; name lookups in
// flight (each a thread while getaddrinfo waits), in all, per organization
// (a lookup outlives its run when its name server does not answer: an
// organization's slow names hold up only its own runs) and per run; how
// long a connection may carry nothing either way before it is closed.
inline constexpr unsigned kMaxOpenConnections = 1024;
inline constexpr unsigned kMaxOpenPerRun = 128;
inline constexpr unsigned kMaxLookups = 128;
inline constexpr unsigned kMaxLookupsPerOrganization = 16;
inline constexpr unsigned kMaxLookupsPerRun = 8;
inline constexpr unsigned kIdleSeconds = 120;

// Daemon-wide: the lookups' threads, the bounds above, the totals of
// `status`.
class Service {
 public:
  explicit Service(asio::io_context& io);
  ~Service();
  Service(const Service&) = delete;
  Service& operator=(const Service&) = delete;

  nlohmann::json status() const;

 private:
  friend class RunProxy;
  struct Gate;
  // Resolves `name` on a thread of its own, counted against
  // `organization`; `done` runs on the io_context with the addresses
  // (deduplicated, in the resolver's order) or the getaddrinfo error.
  void lookup(const std::string& name, const std::string& organization,
              std::function<void(std::vector<Address>, int)> done);

  asio::io_context& io_;
  std::shared_ptr<Gate> gate_;
  unsigned open_ = 0, lookups_ = 0;
  std::map<std::string, unsigned> lookups_by_organization_;
  std::uint64_t runs_ = 0, connections_ = 0, allowed_ = 0, refused_ = 0, bytes_sent_ = 0, bytes_received_ = 0,
                listeners_missing_ = 0;
};

// What the audit lines of a run's connections name besides the run id.
struct RunLabels {
  std::string request_id, organization, tool;
};

class RunProxy : public std::enable_shared_from_this<RunProxy> {
 public:
  RunProxy(Service& service, core::EgressRules rules, RunLabels labels);
  ~RunProxy();

  // The spawner's fourth descriptor of Started: the sandbox's listener
  // arrives on it.
  void start(UniqueFd channel, std::string run_id);
  // The run ended: no new connection; every open one is closed.
  void stop();

  // For the run record: {"listener": bool, "connections", "allowed",
  // "refused", "bytes_sent", "bytes_received"}.
  nlohmann::json summary() const;
  // The same for the run's audit line (" egress_connections=N ...").
  std::string audit_fields() const;
  // "host:port: reason" of the run's first refused or failed connection
  // ("a request: reason" when it named no host), escaped, or "" (a venv
  // build's failure names it: pip alone would not).
  const std::string& first_refusal() const noexcept { return first_refusal_; }

 private:
  struct Conn;
  friend struct Conn;
  struct Head;
  // How a connection ended, for its audit line.
  enum class Verdict { Allowed, Refused, Failed };
  // Why a connection is not served: its verdict, the HTTP status the
  // client is answered with (0: none) and the reason, for both.
  struct Refusal {
    Verdict verdict = Verdict::Failed;
    int status = 0;
    std::string reason;
  };
  // What a step of serve() found, or why the connection ends there.
  template <class T>
  using Step = std::variant<T, Refusal>;

  asio::awaitable<void> receive_listener(UniqueFd channel);
  asio::awaitable<void> accept_loop();
  // One connection: the steps in order (proxy.cc says what each does). The
  // coroutines take their arguments by value (relay's body_left points into
  // the frame of splice, which awaits it).
  asio::awaitable<void> serve(std::shared_ptr<Conn> c);
  std::optional<Refusal> admit();
  asio::awaitable<Step<Head>> read_head(std::shared_ptr<Conn> c);
  asio::awaitable<Step<std::vector<Address>>> resolve(std::shared_ptr<Conn> c, Host host);
  static Step<std::vector<Address>> screen(const std::vector<Address>& candidates, const Host& host);
  asio::awaitable<std::optional<Refusal>> connect_upstream(std::shared_ptr<Conn> c, std::vector<Address> usable);
  asio::awaitable<void> splice(std::shared_ptr<Conn> c, ProxyRequest req, Head head);
  asio::awaitable<void> relay(std::shared_ptr<Conn> c, bool up, std::string pending, std::uint64_t* body_left);
  asio::awaitable<void> relay_down(std::shared_ptr<Conn> c);
  asio::awaitable<std::optional<std::string>> pass_response_heads(std::shared_ptr<Conn> c);
  asio::awaitable<void> watch_idle(std::shared_ptr<Conn> c);
  // How it ends: refused (answered, unless the status is 0), then finished.
  asio::awaitable<void> refuse(std::shared_ptr<Conn> c, Refusal r);
  asio::awaitable<asio::error_code> answer_error(std::shared_ptr<Conn> c, int status, std::string_view why);
  void finish(Conn& c, Verdict v, std::string_view reason);

  Service& svc_;
  core::EgressRules rules_;
  RunLabels labels_;
  std::string run_id_ = "-";
  std::string first_refusal_;
  bool stopped_ = false;
  bool listener_ = false;
  bool capped_ = false;  // past max_connections: the listener is closed
  unsigned lookups_ = 0;
  std::uint64_t connections_ = 0, allowed_ = 0, refused_ = 0, bytes_ = 0, bytes_sent_ = 0, bytes_received_ = 0;
  struct Io;
  std::unique_ptr<Io> io_;  // the channel and the acceptor
  std::set<Conn*> conns_;   // open connections (stop closes them)
};

}  // namespace tsb::egress
