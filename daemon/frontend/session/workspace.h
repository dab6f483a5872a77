// A session workspace (policies/README.md, "sessions"; PROTOCOL.md, section
// 6.8): an organization's sandbox of the session policy, kept by name
// between its sessions, one at a time. Its one long-lived process is the
// keeper (isolate/runner/toolsandbox_workspace.py), started in the session
// policy's tool mode with a socket for stdin: each session's command is
// started by it on pipes the front end makes and sends, and ended, with
// every other process of the sandbox, when the session ends; the sandbox
// and its /work stay. The workspace ends after the policy's idle_ttl with
// no session, at max_lifetime from its start, at a limit of the sandbox's,
// at the daemon's stop, or by the operator.
#pragma once

#include <asio/awaitable.hpp>
#include <asio/local/stream_protocol.hpp>
#include <asio/steady_timer.hpp>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "daemon/frontend/pipeline/pipeline.h"
#include "daemon/policy/policy.h"
#include "daemon/wire/compiled.h"

namespace tsb::egress {
class Service;
}

namespace tsb::core {

class SpawnerLink;

struct Workspace {
  explicit Workspace(asio::io_context& io)
      : keeper(io), changed(io, std::chrono::steady_clock::time_point::max()) {}
  // A session's own sandbox, made for it and ended after it (not kept, no
  // TTL, no audit line of its own): every session runs under a keeper.
  bool one_shot = false;
  std::string key;  // the client's uid, the organization, the policy and the name (workspace_key)
  std::string organization_id, name;
  std::string request_id;  // a one-shot's session request, for its egress proxy's labels
  std::uint32_t peer_uid = 0;  // the client uid whose it is
  std::shared_ptr<const Policy> policy;
  // Its first session's packages (packages.h), bound for its whole life.
  std::string venv, node_modules;
  std::shared_ptr<void> packages_hold;
  std::string id;  // its sandbox's run id, once started
  asio::local::stream_protocol::socket keeper;
  CancelSignal cancel;          // ends the sandbox
  asio::steady_timer changed;   // cancelled when it started, and when it ended
  bool started = false, ended = false;
  bool busy = false;            // a session runs in it
  bool ending = false;          // and that session is ending: the next may wait for it
  // Ends that session when its client has gone (true then), as its watch
  // would within 500 ms: a client's next session need not wait that long.
  std::function<bool()> end_if_client_gone;
  // Why it ended: "ttl", "shutdown", "operator", "daemon" (it could not be
  // kept), "keeper" (its keeper exited, broke the protocol or did not
  // answer), "lifetime", "limit"; "" while it lives.
  std::string ended_by;
  std::optional<Refusal> refused;  // it never started: why
  // Once ended: the sandbox's end (its reason, CPU, peak memory, Landlock)
  // and its egress proxy's summary and audit fields, if it had one.
  isolate::RunResult result;
  nlohmann::json egress;
  std::string egress_audit;
  unsigned sessions = 0;        // sessions it has served
  std::chrono::steady_clock::time_point last_used = std::chrono::steady_clock::now();
  const std::chrono::steady_clock::time_point created = last_used;

  void end(const char* why) {
    if (ended_by.empty()) ended_by = why;
    cancel.request();
  }
};

// The registry's key of an organization's workspace `name` under a policy,
// for the clients of uid `peer_uid`: the organization is what a client
// claims, so another uid never reaches it (its own workspace of that name
// is another).
std::string workspace_key(std::uint32_t peer_uid, const std::string& organization_id, const std::string& policy,
                          const std::string& name);
// The message that starts a session's command in the keeper (JSON).
std::string keeper_session_message(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env);

// What the keeper said of a session's command: its exit status or signal,
// and the CPU time it and the processes it waited for used.
struct KeeperStatus {
  int exit_code = -1;
  int signal = 0;
  double cpu_ms = 0;
};
// A keeper's answer (JSON text), checked: nullopt when it is not one.
std::optional<KeeperStatus> parse_keeper_status(std::string_view body);
// The most a message to the keeper may hold (its MAX_MESSAGE): a session's
// command and environment beyond it are refused before anything is sent.
inline constexpr std::size_t kMaxKeeperMessage = 1u << 20;
// A session's message to the keeper: a 4-byte big-endian length, `body`
// (JSON), the pipe ends `fds` attached (SCM_RIGHTS) to its first bytes,
// the rest written as the keeper reads; false when the socket failed.
asio::awaitable<bool> send_session_to_keeper(Workspace& ws, const std::string& body, std::span<const int> fds);
// The end of the session in it, at once (4 + 13 bytes, which a socket the
// keeper reads always has room for); false when it could not go.
bool send_end_to_keeper(Workspace& ws);
// A signal for the session's command (one the keeper forwards: SIGHUP,
// SIGINT, SIGQUIT, SIGUSR1, SIGUSR2, SIGTERM, SIGWINCH), likewise at once.
bool send_signal_to_keeper(Workspace& ws, int signal);
// Whether the keeper forwards `signal` (its FORWARDED).
bool forwarded_signal(int signal);
// The keeper's next answer; nullopt when the socket failed or closed (the
// sandbox ended) or the answer is not one.
asio::awaitable<std::optional<KeeperStatus>> read_keeper_status(Workspace& ws);

// A spawner's refusal as the client's error code, as a run's.
protocol::ErrorCode refusal_code(spawn::RefuseCode rc);

// Starts the workspace's sandbox and keeps it until it ends; then `gone`
// (out of the registry), the end marked (ended, changed) and its audit line.
asio::awaitable<void> keep_workspace(std::shared_ptr<Workspace> ws, SpawnerLink& link, egress::Service& egress,
                                     std::function<void(Workspace&)> gone);

}  // namespace tsb::core
