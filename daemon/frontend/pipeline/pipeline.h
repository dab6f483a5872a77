// The run pipeline: every execute and run_tool request goes through it,
// whichever backend runs it.
//
//   prepare_run   once per request: placement (organization, policy,
//                 backend), the sandbox-config fingerprint, the tool's
//                 environment checked against the policy, the effective
//                 timeout, the runner's request and nonce (tool mode on
//                 E2B; a local runner's result channel is the backend's).
//   RunBackend::run  the backend's own work (a local sandbox, an E2B cell, ...).
//                 It stops the run when PreparedRun::cancel is requested
//                 (the client went away, the daemon stops).
//   finish_run    once per run: the ToolExecutionResult (Letta's shaping),
//                 the run record, the daemon's totals and the audit line.
//
// The server (daemon/frontend/server.cc) owns the connection: it admits the
// request, watches the socket for the client going away while the backend
// runs, and writes the answer.
#pragma once

#include <sys/types.h>

#include <asio/awaitable.hpp>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "daemon/frontend/pipeline/cancel.h"
#include "daemon/frontend/letta/result.h"
#include "daemon/policy/registry.h"
#include "daemon/venv/npm_requirements.h"
#include "daemon/venv/requirements.h"
#include "isolate/supervise/outcome.h"
#include "protocol/messages.h"

namespace tsb::core {

struct Peer {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;  // supplementary groups at connect() (SO_PEERGROUPS)
};

// A request answered with an error line instead of a result: no run.
struct Refusal {
  protocol::ErrorCode code = protocol::ErrorCode::Internal;
  std::string message;
};

// What a backend installs of a run's pip requirements (Letta's
// pip_requirements: its sandbox config's and its tool's together): its
// capability under a policy, against which prepare_run checks a run's
// requirements, once.
struct RequirementRules {
  std::string refusal;             // not empty: it installs none under this policy, and why
  std::uint32_t max = 16;          // per run: the policy's packages.max_requirements
  std::vector<std::string> allow;  // fnmatch patterns over PEP 503 names ("packages.allow"); empty: any
  bool allow_urls = false;         // the "name @ URL" form
  std::string urls_hint;           // said after a refused URL: the switch that allows them
};

// What a backend does with TypeScript tools (Letta's source_type
// "typescript") under a policy: whether it runs them, and what it installs
// of their npm requirements; prepare_run checks a run against it, once.
struct TypeScriptRules {
  std::string refusal;             // not empty: it runs no TypeScript tool under this policy, and why
  std::string npm_refusal;         // not empty: it installs no npm package under this policy, and why
  std::uint32_t max_npm = 16;      // npm requirements per run
  std::vector<std::string> allow;  // fnmatch patterns over npm package names; empty: any
  bool pip = false;                // whether a TypeScript run may also have pip requirements (E2B installs them)
};

// A run's (or a session's: `per`) pip or npm requirements checked against
// a backend's rules, after their refusal: the count, the canonical set
// (into `out`), the allow-list. Nothing, or the refusal.
std::optional<Refusal> checked_pip_set(const RequirementRules& rules, const Policy& pol,
                                       const std::vector<std::string>& names, std::string_view per,
                                       venv::RequirementSet& out);
std::optional<Refusal> checked_npm_set(const TypeScriptRules& rules, const Policy& pol,
                                       const std::vector<std::string>& names, std::string_view per,
                                       std::vector<venv::NpmRequirement>& out);

class RunBackend;
// The daemon's backends (null: not available) and whether E2B is
// configured (organizations may then be placed there).
struct Backends {
  RunBackend* local = nullptr;
  RunBackend* e2b = nullptr;
  bool e2b_configured = false;
};

struct PreparedRun {
  // The request (it outlives the run) and its fields common to both modes.
  const protocol::Request* request = nullptr;
  const protocol::CommonRunFields* common = nullptr;
  bool tool_mode = false;
  // A TypeScript tool (source_type "typescript"), and its npm requirements,
  // canonical and checked against the backend's TypeScriptRules.
  bool typescript = false;
  std::vector<venv::NpmRequirement> npm_requirements;
  Peer peer;
  // The policy set the run started with: a reload does not change it.
  std::shared_ptr<const PolicySet> policies;
  Placement placement;
  const Policy& policy() const noexcept { return *placement.policy; }
  // The backend the placement names.
  RunBackend* backend = nullptr;
  // The run's pip requirements, canonical (one per name, sorted) and
  // checked against what the backend installs under the policy.
  venv::RequirementSet requirements;
  // The sandbox config the run is described by: the request's, or on E2B
  // its "e2b" alternative when it names one (Letta's E2B sandbox uses the
  // organization's E2B config); null without one. Points into the request.
  const protocol::SandboxConfig* sandbox_config = nullptr;
  // Letta's SandboxConfig.fingerprint() of that config.
  std::optional<std::string> fingerprint;
  // The request's environment (on E2B, its "e2b" alternative's when it
  // names one) plus LETTA_AGENT_ID / LETTA_PROJECT_ID, every
  // name allowed by the policy and none it fixes; and the whole environment
  // of a local sandbox: the policy's fixed values, then these.
  std::map<std::string, std::string> env;
  std::vector<std::string> sandbox_env;
  // Tool mode: the request's variables that change how a program starts
  // (changes_how_a_program_starts): left out of sandbox_env and handed to the
  // runner in its request, which sets them for the tool only.
  std::map<std::string, std::string> runner_env;
  // Names the request set that the policy fixes: the policy's value is
  // kept (record.env_overridden), sorted.
  std::vector<std::string> env_overridden;
  // The wall-clock limit: the policy's, or the request's when lower; and
  // what the request asked for, if anything (record.timeout_*).
  std::chrono::milliseconds timeout{60'000};
  std::optional<double> timeout_requested_s;
  // Tool name, timeout for messages, fingerprint, mode, nonce, limits.
  ShapeContext shape;
  // Tool mode: the trusted runner on the host, and what it reads on stdin
  // in an E2B cell (a local one gets its request on its result channel).
  std::string runner_path;
  std::string runner_request;
  // Requested when the client goes away or the daemon stops.
  std::shared_ptr<CancelSignal> cancel;
  // Whether the client has closed its end entirely, looked at now (the
  // watch behind `cancel` sees it only on its next turn of the loop).
  std::function<bool()> client_gone;
};

// Everything before the backend runs: a refusal when the request cannot
// run (placement, backend, environment, sandbox_config, pip requirements,
// runner missing).
// LD_*, MALLOC_*, PYTHON* and the other variables glibc ignores for setuid
// programs: what the trusted runner must not start with.
bool changes_how_a_program_starts(std::string_view name);
// Those, and what a program reads from its environment once, as it starts
// or loads (the locale: LANG, LANGUAGE, LC_*; TZ; HOME, for Python's user
// site; OPENSSL_*, read when hashlib, which a warm runner has loaded,
// starts OpenSSL): a warm sandbox, started without the request's
// variables, cannot show a run that sets one what a cold start would. Such
// a run is cold.
bool read_at_start(std::string_view name);

std::optional<Refusal> prepare_run(const protocol::Request& req, const Peer& peer,
                                   std::shared_ptr<const PolicySet> policies, const Backends& backends,
                                   const std::string& runner_path, PreparedRun& out);

// What a backend gives back: what happened, never a shaped result.
// finish_run shapes every run once (daemon/frontend/letta/result.h).
struct BackendRun {
  // The backend did not run the request (busy, unavailable, a check of its
  // own): the client gets this error and nothing else below is read.
  std::optional<Refusal> refused;
  // What happened, as the engine reports it (a remote backend fills in
  // what it knows).
  isolate::RunResult run;
  // A step before the tool failed (a venv build, a pip install, E2B):
  // which exception Letta would report, and why. The run's stdout_data and
  // stderr_data hold what the step printed.
  std::optional<RunFailure> failure;
  // Script mode in an E2B kernel: the execution as the kernel reported it.
  std::optional<CellOutcome> cell;
  // Script mode, a pickle payload: its decoding (LocalBackend).
  std::optional<DecodedPickle> decoded;
  // Tool mode in a local sandbox: what came on the result channel.
  std::optional<ChannelOutcome> channel;
  // Run-record fields the backend adds or overrides.
  nlohmann::json record = nlohmann::json::object();
  // For the record, the totals and the audit line when the backend ended
  // the run for a reason the engine has no name for ("" = run.reason).
  std::string end_reason;
  // Backend fields of the audit line, " key=value" each.
  std::string audit;
  // What the backend keeps until the run is recorded (a local run slot): a
  // `status` never shows a run that is out of its slot but not yet in the
  // totals.
  std::shared_ptr<void> held;
};

class RunBackend {
 public:
  virtual ~RunBackend() = default;
  virtual std::string_view name() const noexcept = 0;
  // What it installs of pip requirements under `p` (prepare_run checks).
  virtual RequirementRules requirement_rules(const Policy& p) const = 0;
  // What it does with TypeScript tools under `p` (prepare_run checks).
  virtual TypeScriptRules typescript_rules(const Policy& p) const = 0;
  // May move what it feeds the run out of `run` (runner_request).
  virtual asio::awaitable<BackendRun> run(PreparedRun& run) = 0;
};

// The answer: shapes the result from what the backend reports (the only
// place a ToolExecutionResult is asked for), completes the run record, writes the audit line and returns the response line. `ended`
// is the end reason, for the daemon's totals.
std::string finish_run(const PreparedRun& p, std::string_view backend, BackendRun& out,
                       std::chrono::steady_clock::duration took, std::string* ended);

}  // namespace tsb::core
