// Sessions (protocol/PROTOCOL.md, section 6.8; policies/README.md,
// "sessions"): one long-lived sandbox of a policy's session policy that runs
// one command, an MCP server over stdio, with the client's connection as its
// stdio. After the answer line the client's bytes are the command's stdin
// (its shutdown(SHUT_WR) the stdin's end), and the daemon's are frames: the
// command's stdout and stderr as they come, then the session's end with its
// record. The session ends, its whole tree with it, when the command exits,
// when the client goes away, after idle_timeout without a byte either way,
// at max_lifetime, past stream_bytes or another of its limits, and at the
// daemon's stop.
#pragma once

#include <asio/awaitable.hpp>
#include <asio/io_context.hpp>
#include <asio/local/stream_protocol.hpp>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "daemon/frontend/pipeline/pipeline.h"
#include "daemon/policy/policy.h"

namespace tsb::egress {
class Service;
}

namespace tsb::core {

class LocalBackend;
class SpawnerLink;
struct Workspace;

struct SessionOpen {
  std::shared_ptr<const Policy> policy;      // placed for the organization, with "sessions"
  std::vector<std::string> argv;             // argv[0] resolved (resolve_session_command)
  std::map<std::string, std::string> env;    // the request's, checked (build_environment)
  std::string request_id, organization_id, agent_id;
  Peer peer;
  std::function<bool()> client_gone;         // the client closed its end entirely
  std::chrono::milliseconds write_timeout{30'000};  // for each write to the client
  // What the client sent after its request line, read with it: the first
  // bytes of the command's stdin (after the launcher's command frame).
  std::string early_input;
  // The organization's workspace to run in (workspace.h), by name; "": none.
  std::string workspace;
  // The command's own packages (packages.h): the cache keys bound at /venv
  // and /node_modules ("": the policy's own venv, no node_modules), held
  // while the session (or its workspace) runs; their part of the record.
  std::string venv, node_modules;
  std::shared_ptr<void> packages_hold;
  nlohmann::json packages;
};

// How many sessions may be open, a kept workspace counting as one (a
// session in it takes no other): in all, and per organization.
struct SessionLimits {
  unsigned max = 8, per_organization = 4;
};

// The open sessions: each one's order to the spawner, its relay on the
// client's connection, its watches, its end record and audit line; the
// bounds; their part of `status`.
class Sessions {
 public:
  using ClientSocket = asio::local::stream_protocol::socket;
  // `local`: the venv cache and its builds, for a command's own packages.
  Sessions(asio::io_context& io, SpawnerLink& link, egress::Service& egress, LocalBackend& local)
      : io_(io), link_(link), egress_(egress), local_(local) {}

  // Opens a session and relays it on `client` until it ends: nothing, or
  // why it did not open (the client is then owed an error line; it was
  // sent nothing).
  asio::awaitable<std::optional<Refusal>> run(SessionOpen open, ClientSocket& client);
  void set_limits(SessionLimits l) { limits_ = l; }
  // Shutdown: nothing new opens, and every session ends now (sessions
  // have no grace); then wait until none is open.
  void end_all();
  bool empty() const noexcept { return reg_->open.empty() && reg_->workspaces.empty() && reg_->preparing.empty(); }
  nlohmann::json status() const;
  // The operator's view (session_list): each open session's id, who opened
  // it, what it runs (the program, not its arguments), its age and bytes;
  // and each kept workspace's.
  nlohmann::json list() const;
  nlohmann::json list_workspaces() const;
  // Ends an open session, or a kept workspace (and the session in it), for
  // the operator (the records say "operator"); false when none has that id.
  bool kill(const std::string& id);
  // Sends `signal` (one the keeper forwards) to the command of open session
  // `id`, for its own client's uid or the operator (uid 0); false when no
  // such session of theirs runs a command now.
  bool signal(const std::string& id, int signal, std::uint32_t peer_uid);

  struct Session;

 private:
  unsigned open_of(const std::string& org) const;
  // A session's slot, or its workspace (found, or made and started here):
  // nothing, or why it may not open.
  // A session's own packages (packages.h), while it holds a slot of
  // Registry::preparing (`prepared`, until admitted).
  struct Prepared;
  asio::awaitable<std::optional<Refusal>> packages(SessionOpen& open, std::unique_ptr<Prepared>& prepared);
  // `preparing`: the session holds a slot of Registry::preparing.
  std::optional<Refusal> admit(const SessionOpen& open, std::shared_ptr<Workspace>& ws, bool& own_slot,
                               bool preparing = false);

  asio::io_context& io_;
  SpawnerLink& link_;
  egress::Service& egress_;
  LocalBackend& local_;
  SessionLimits limits_;
  bool stopping_ = false;
  struct Registry {
    std::set<Session*> open;
    std::map<std::string, std::shared_ptr<Workspace>> workspaces;  // by workspace_key
    unsigned slots = 0;                    // sessions outside workspaces, and workspaces
    std::map<std::string, unsigned> orgs;  // the same, per organization
    // Sessions whose packages are being found or built (packages.h), by
    // organization: each counts as a slot meanwhile. Their builds stop
    // only at the daemon's stop (a client that leaves does not stop one).
    std::multiset<std::string> preparing;
    CancelSignal stop_builds;
  };
  std::shared_ptr<Registry> reg_ = std::make_shared<Registry>();
  std::uint64_t total_ = 0, refused_ = 0;
};

}  // namespace tsb::core
