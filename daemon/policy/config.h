// toolsandboxd configuration: one JSON-with-comments file (default
// <sysconfdir>/toolsandboxd/toolsandboxd.json), every key optional with a secure
// default. Documented key by key in docs/CONFIGURATION.md.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "isolate/engine/engine.h"
#include "isolate/base/result.h"

namespace tsb::core {

class SourceFiles;

struct E2BConfig {
  bool enabled = false;           // true when an API key file is configured
  std::string api_key_file;       // readable only by the daemon, or a systemd credential
  std::string api_url = "https://api.e2b.app";
  std::string sandbox_url;        // "" = https://{port}-{id}.{domain}; else a pattern with {port} and {id}
  std::string domain = "e2b.app";
  std::string template_id = "code-interpreter-v1";
  std::chrono::seconds sandbox_ttl{300};
  unsigned max_sandboxes = 16;
  bool allow_requirement_urls = false;
};

// Per-tool venvs (daemon/venv/cache.h): where they are kept and how much
// they may take together.
struct VenvConfig {
  std::string cache_dir = "/var/cache/toolsandbox/venvs";  // owned by front_end_user
  std::uint64_t max_bytes = 10ull << 30;                    // beyond it, least recently used first go
};

struct DaemonConfig {
  std::string source = "<embedded defaults>";
  std::string socket_path = "/run/toolsandboxd/toolsandboxd.sock";
  mode_t socket_mode = 0660;
  std::string socket_group;             // "" = root's group
  std::vector<uid_t> allowed_uids{0};
  std::vector<gid_t> allowed_gids;
  unsigned max_concurrent_runs = 8;
  unsigned max_queued_runs = 32;
  // Sessions (policies/README.md, "sessions") open at once, in all and per
  // organization; 0: none. Apart from the run slots.
  unsigned max_sessions = 8;
  unsigned max_sessions_per_organization = 4;
  std::size_t max_frame_bytes = 32u << 20;
  // Connections open at once; beyond it a new peer gets `busy` and is closed.
  unsigned max_connections = 256;
  // Bytes all connections may hold at once beyond kConnectionAllowance each:
  // request lines being read, requests being handled, answers being written.
  // At least max_frame_bytes; when absent, max(256 MiB, max_frame_bytes).
  std::size_t max_buffered_bytes = 256u << 20;
  std::chrono::milliseconds request_timeout{30000};   // a request line must arrive within this
  std::chrono::milliseconds write_timeout{30000};     // an answer must be taken within this
  std::chrono::milliseconds shutdown_grace{30000};
  std::string policies_dir;             // "" = the policies embedded in the binary
  std::string organizations_file;       // "" = embedded organizations.json
  std::vector<std::string> bind_allowlist;
  std::string runner_path;              // "" = found next to the binary / in the data dir
  std::string front_end_user = "toolsandboxd";  // the unprivileged front end's user (never uid 0)
  isolate::EngineConfig engine;
  E2BConfig e2b;
  VenvConfig venvs;
};

// What each connection may hold without drawing on max_buffered_bytes: a
// small request and its answer never wait for the global budget.
inline constexpr std::size_t kConnectionAllowance = 64u << 10;

// Loads `path` (through `files` when given: daemon/policy/sources.h); a
// missing file with `optional` gives the defaults.
Result<DaemonConfig> load_daemon_config(const std::string& path, bool optional, SourceFiles* files = nullptr);

// The E2B API key file (e2b.api_key_file). Reads the API key file. Refused unless it is a regular file owned by root
// with no group or other permission bits, except under $CREDENTIALS_DIRECTORY
// (systemd's LoadCredential=), which systemd protects itself. The key must be
// one token of printable ASCII. Messages never contain the file's content.
// `fd`: the file already opened (by the spawner, which may read it), else -1.
Result<std::string> read_e2b_api_key(const std::string& path, int fd = -1);

}  // namespace tsb::core
