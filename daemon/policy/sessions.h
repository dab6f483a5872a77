// A policy's "sessions" section (policies/README.md, "sessions"): long-lived
// sandboxes that run one command each, an MCP server over stdio, with the
// client's connection as the command's stdin and stdout for the session's
// life. The same namespaces, table, network, environment rules, seccomp
// and user as the policy's runs; limits of their own.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "daemon/policy/jsonc.h"
#include "isolate/base/result.h"

namespace tsb::core {

struct SessionsPolicy {
  bool enabled = false;                  // the policy has "sessions"
  // The programs a session may start: absolute, normalised paths inside
  // the sandbox (below /usr, the host's read-only, or /venv). A request's
  // command names one of them, or its last component ("node").
  std::vector<std::string> commands;
  std::uint64_t memory = 512ull << 20;   // the session's cgroup, its whole tree
  std::uint64_t pids = 64;
  std::chrono::milliseconds cpu_time{600'000};      // CPU of the whole session
  std::chrono::milliseconds idle_timeout{600'000};  // no byte either way for this long: ended
  std::chrono::milliseconds max_lifetime{3'600'000};
  std::uint64_t stream_bytes = 1ull << 30;  // bytes through the stream, both ways and stderr together
  // "workspace": a session may name one (its request's "workspace"): a
  // sandbox kept between that organization's sessions of that name, one at
  // a time, whose /work (workspace_size bytes) outlives each session's
  // command; removed after workspace_idle_ttl with no session, and at
  // max_lifetime from its first.
  bool workspace = false;
  std::uint64_t workspace_size = 256ull << 20;
  std::chrono::milliseconds workspace_idle_ttl{1'800'000};
};

// "sessions": the object `o` into `s`.
Status parse_sessions(ObjectReader o, SessionsPolicy& s);
// Its part of the canonical policy.
nlohmann::json sessions_json(const SessionsPolicy& s);
// The names of the session policy of a policy with "sessions", and of its
// workspaces' (a policy whose sessions keep them).
std::string session_policy_name(std::string_view policy);
std::string workspace_policy_name(std::string_view policy);
// The command a request names, as the policy allows it: its absolute path
// (a bare name is matched against the last components of `commands`), or
// "" when the policy has no such command.
std::string resolve_session_command(const SessionsPolicy& s, std::string_view name);

}  // namespace tsb::core
