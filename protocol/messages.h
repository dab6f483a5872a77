// Protocol v1: newline-delimited JSON over a Unix stream socket. One
// request object per line, one response object per line, in order.
// Decoding is strict: unknown fields, wrong types, bad UTF-8, a missing or
// wrong version are errors with a stable code. protocol/PROTOCOL.md is the
// reference; protocol/schema/*.json are the JSON Schemas.
//
// A request line is validated by protocol/json_scan.h without building a
// document; the fields the daemon reads are decoded from their slices, and
// the values it only forwards to the tool (args, json_schema, agent_state)
// stay the text the client sent. Decoding one line never holds much more
// than the line itself (see the limits below).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

namespace tsb::protocol {

inline constexpr int kProtocolVersion = 1;
inline constexpr std::size_t kDefaultMaxFrameBytes = 32u << 20;
inline constexpr std::size_t kMaxIdLength = 128;

// Fields the daemon decodes into containers, where each element costs a
// fixed overhead beyond its bytes, are bounded so that a line of millions of
// tiny elements cannot make the daemon hold many times the line's size.
inline constexpr std::size_t kMaxEnvVariables = 4096;        // env entries
inline constexpr std::size_t kMaxPipRequirements = 1024;     // pip_requirements elements
inline constexpr std::size_t kMaxNpmRequirements = 1024;     // npm_requirements elements
inline constexpr std::size_t kMaxSandboxConfigBytes = 1u << 20;  // sandbox_config, as sent
inline constexpr std::size_t kMaxCommandArgs = 256;          // a session's command, program included
inline constexpr std::size_t kMaxCommandBytes = 64u << 10;   // its strings together, a NUL each

// A session's frames, daemon to client, after its answer line (PROTOCOL.md,
// "Sessions"): a kind byte, a 4-byte big-endian length, the payload.
inline constexpr char kSessionStdout = 'o', kSessionStderr = 'e', kSessionEnd = 'x';
inline constexpr std::size_t kMaxSessionFrame = 64u << 10;  // a payload's most
std::string session_frame(char kind, std::string_view payload);

// Stable error codes. Clients switch on these, never on messages.
enum class ErrorCode {
  BadRequest,     // malformed JSON, wrong types, unknown fields, bad version
  TooLarge,       // a frame above the daemon's max_frame_bytes
  Unauthorized,   // the peer's uid/gid is not allowed
  Busy,           // concurrency limit and queue are full: retry later
  PolicyDenied,   // the policy or organization does not allow this request
  Timeout,        // the client sent no complete request in time
  Unavailable,    // the daemon is shutting down, or a backend is unreachable
  Internal,       // a bug or an unexpected system failure
};
std::string_view error_code_name(ErrorCode c);

struct ProtocolError {
  ErrorCode code;
  std::string message;
};

// A Letta sandbox config, for the fingerprint (SandboxConfig.fingerprint in
// letta-ai/letta's letta/schemas/sandbox_config.py).
struct SandboxConfig {
  std::string type;               // "local" | "e2b" | ...
  nlohmann::json config;          // the config dict as Letta stores it
  // The config's own organization (Letta's SandboxConfig.organization_id),
  // which its fingerprint uses; absent: the request's organization_id.
  std::optional<std::string> organization_id;
  // Sent as null: the config has no organization (Letta's None), which its
  // fingerprint hashes as null.
  bool organization_null = false;
};

// What a run delegated to E2B uses instead of the request's own values
// (Letta's E2B sandbox reads the organization's E2B sandbox config and that
// config's variables): unset members keep the request's.
struct E2BAlternative {
  std::optional<SandboxConfig> sandbox_config;
  std::optional<std::map<std::string, std::string>> env;
};

// The language of the tool (Letta's Tool.source_type).
enum class SourceType { Python, TypeScript };

struct CommonRunFields {
  std::string tool_name;          // Python identifier; used in messages and audit
  SourceType source_type = SourceType::Python;
  // A TypeScript tool's npm packages (Letta's Tool.npm_requirements, each
  // "name" or "name@range"), checked by the pipeline (venv/npm_requirements.h).
  std::vector<std::string> npm_requirements;
  std::string organization_id;    // selects policy and backend
  std::optional<std::string> policy;  // must be allowed for the organization
  std::map<std::string, std::string> env;  // the tool's variables (secrets included)
  std::optional<double> timeout_s;    // lowered to the policy's wall_timeout if higher
  std::optional<SandboxConfig> sandbox_config;
  std::optional<E2BAlternative> e2b;  // read only when the run is placed on E2B
  std::optional<std::string> agent_id;
  std::optional<std::string> project_id;
  // "json_dialect": "python": func_return and agent_state are written as
  // Python's json.dumps writes them (NaN, Infinity, -Infinity tokens), so a
  // Python client's json.loads gets back exactly the values the tool
  // returned. Default "strict": RFC 8259 numbers only (those tokens become
  // the strings "NaN", "Infinity", "-Infinity").
  bool python_json = false;
};

// execute: a complete Python script, as letta-server generates it today.
struct ExecuteRequest {
  CommonRunFields common;
  std::string script;
};

// run_tool: source + args as data; a trusted runner calls the function.
// args, json_schema and agent_state are JSON text exactly as the client sent
// it (validated, duplicate-free, whitespace and number spelling kept), never
// a document: they are only forwarded to the runner, so an integer of any
// size reaches the tool as written.
struct RunToolRequest {
  CommonRunFields common;
  std::string source_code;
  std::string args = "{}";           // an object: name -> JSON value
  std::string json_schema = "null";  // null or Letta's Tool.json_schema (an object)
  std::string agent_state = "null";  // null or an object
  std::vector<std::string> pip_requirements;  // a venv of the run's own (local), installed in the sandbox (E2B)
};

struct StatusRequest {};

// session: one long-lived sandbox under a policy with "sessions", running
// `command` (PROTOCOL.md, "Sessions"); its answer turns the connection into
// the command's stdin and its framed stdout and stderr.
struct SessionRequest {
  std::string organization_id;        // selects the policy, as for a run
  std::optional<std::string> policy;  // must be allowed for the organization
  std::vector<std::string> command;   // the program (a path or a name the policy allows) and its arguments
  std::map<std::string, std::string> env;
  std::optional<std::string> agent_id;
  // A workspace of the organization's, by name: the session runs in its
  // kept sandbox (policies/README.md, "sessions"; PROTOCOL.md, section 6.8).
  std::optional<std::string> workspace;
};

// session_list and session_kill: the operator's view of the open sessions
// and the end of one (peers of uid 0 only; PROTOCOL.md, section 6.8).
struct SessionListRequest {};
struct SessionKillRequest {
  std::string session_id;
  // A signal for the session's command instead of its end (one of
  // kSessionSignals, by number): the session's own client may send one.
  std::optional<int> signal;
};
// The signals a session's command may be sent (session_kill's "signal"),
// by name as the request writes them.
struct SessionSignal {
  const char* name;
  int number;
};
extern const SessionSignal kSessionSignals[7];
std::string_view session_signal_name(int number);

struct Request {
  std::string id;
  std::variant<ExecuteRequest, RunToolRequest, StatusRequest, SessionRequest, SessionListRequest, SessionKillRequest>
      body;
  std::string_view type_name() const;
};

// Decode one frame (without its newline). On error, `id` is set when it
// could be read, so the error response can carry it.
std::variant<Request, ProtocolError> decode_request(std::string_view line, std::string* id_out);

// Response lines.
std::string encode_error(std::string_view id, ErrorCode code, std::string_view message);
std::string encode_ok(std::string_view id, std::string_view key, const nlohmann::json& payload);
// The same, with members of `payload` given as JSON text (written as is, in
// the place their key sorts to, without whitespace between their tokens, so
// the response stays one line): values kept exactly as a tool returned them.
std::string encode_ok(std::string_view id, std::string_view key, const nlohmann::json& payload,
                      const std::map<std::string, std::string>& raw_members);

bool is_python_identifier(std::string_view s);  // and not a keyword
bool is_env_name(std::string_view s);           // [A-Za-z_][A-Za-z0-9_]*, at most 256

}  // namespace tsb::protocol
