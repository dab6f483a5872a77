// The E2B backend: runs a request in an E2B cloud sandbox instead of a
// local one. Wire protocol, as E2B documents it and its Python SDKs (e2b,
// e2b-code-interpreter) speak it: the control-plane REST API (the OpenAPI
// spec, spec/openapi.yml in e2b-dev/infra and e2b-dev/E2B), envd's
// Connect-RPC process API (spec/envd/process/process.proto in e2b-dev/E2B)
// and the code interpreter's /execute stream (template/server/ in
// e2b-dev/code-interpreter). Design, failure handling and what happens to
// each sandbox: docs/E2B.md.
//
// Flow of one run (the pipeline checked the environment and the pip
// requirements, against requirement_rules): read the runner -> take a sandbox (an idle one of this daemon
// with the same reuse key, else a running one found by its metadata, else a
// new one), refreshing its TTL -> install missing requirements (pip; npm for
// a TypeScript tool) through
// envd's process API (argv, never a shell) -> run the cell through the code
// interpreter's /execute (NDJSON stream) -> report what happened (the
// pipeline shapes it, as a local run) -> give the sandbox back, or kill it when the run failed or timed out.
//
// Secrets: the API key goes only into the X-API-KEY header of control-plane
// calls and the sandbox's access token only into X-Access-Token; neither is
// ever logged, put into a URL, a body, a sandbox's env or its code. Messages
// that quote an E2B answer are scrubbed of both.
#pragma once

#include <asio/awaitable.hpp>
#include <asio/io_context.hpp>
#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "daemon/policy/config.h"
#include "isolate/base/result.h"
#include "isolate/base/unique_fd.h"
#include "daemon/frontend/e2b/http.h"
#include "daemon/policy/registry.h"
#include "daemon/frontend/pipeline/pipeline.h"
#include "protocol/messages.h"

namespace tsb::core {

// ---------------------------------------------------------------------------
// Pure helpers (unit-testable)
// ---------------------------------------------------------------------------

// The `metadata` query value of GET /v2/sandboxes exactly as the Python SDK
// builds it: urlencode({"metadata": "&".join(quote(k)+"="+quote(v))}).
// Returns the whole "metadata=..." parameter.
std::string e2b_metadata_param(const std::vector<std::pair<std::string, std::string>>& metadata);

// Where a sandbox port is served: the configured pattern ({port}, {id})
// when set, else https://{port}-{id}.{domain} with the sandbox's own domain
// when E2B gave one.
std::string e2b_sandbox_base_url(const E2BConfig& cfg, std::string_view sandbox_id, int port,
                                 std::string_view sandbox_domain);


// The fixed program run as the cell in tool mode; "@BLOB@" stands for the
// base64 literal. Exposed for tests.
std::string e2b_tool_cell(std::string_view blob_base64);

// TypeScript tools (docs/E2B.md, "TypeScript tools"), as Letta's
// generate_typescript_execution_script (letta/services/tool_sandbox/
// typescript_generator.py) treats them:
// - the tool's source as its script holds it: the lines its import pattern
//   (r"^import\s+.+?['\"];?\s*$", MULTILINE) matches moved to the top, each
//   stripped, and every r"\bexport\s+" removed (in strings too, as there);
std::string e2b_typescript_source(std::string_view source);
// - whether its script awaits the call (is_async_typescript_function: the
//   source says "export async function NAME" or "export const NAME = async");
bool e2b_typescript_is_async(std::string_view source, std::string_view name);
// - a name the tool-mode cell may look up: [A-Za-z_$][A-Za-z0-9_$]*.
bool e2b_typescript_identifier(std::string_view name);
// The fixed TypeScript tool-mode cell; "@BLOB@" stands for the base64 literal.
std::string e2b_typescript_tool_cell(std::string_view blob_base64);

// ---------------------------------------------------------------------------
// The backend
// ---------------------------------------------------------------------------

class E2BBackend final : public RunBackend {
 public:
  E2BBackend(asio::io_context& io, E2BConfig cfg);
  ~E2BBackend() override;
  E2BBackend(const E2BBackend&) = delete;
  E2BBackend& operator=(const E2BBackend&) = delete;

  // Reads the API key (start-up). An error means the daemon must not start.
  Status load_key(UniqueFd key = {});
  // On reload: reads the new key first; on failure nothing changes.
  Status reconfigure(const E2BConfig& cfg, UniqueFd key = {});

  std::string_view name() const noexcept override { return "e2b"; }
  RequirementRules requirement_rules(const Policy& p) const override;
  TypeScriptRules typescript_rules(const Policy& p) const override;
  // One execute or run_tool request placed on E2B (prepared by the
  // pipeline). The run's cancel signal ends it and kills its sandbox.
  asio::awaitable<BackendRun> run(PreparedRun& p) override;

  // Stop taking runs, let in-flight ones finish within `grace`, cancel the
  // rest (their sandboxes are killed), and wait briefly for pending kills.
  // Idle sandboxes are left to their TTL.
  asio::awaitable<void> shutdown(std::chrono::milliseconds grace);

  nlohmann::json status_json() const;

  struct Sandbox;
  struct RunCtx;
  // What ends a run that failed: its end reason, detail, message and
  // exception, and whether the sandbox it holds is killed. The steps of a
  // run return it as the failure of their Result; one exists only when a
  // step failed. The step that meets a failure names what it was doing in
  // the message; its callers pass it up unchanged.
  struct Fail;

 private:
  using Clock = std::chrono::steady_clock;
  template <class T>
  using Outcome = Result<T, Fail>;
  template <class T>
  using Step = asio::awaitable<Outcome<T>>;

  std::vector<std::pair<std::string, std::string>> control_headers(bool json_body) const;
  std::vector<std::pair<std::string, std::string>> data_headers(const Sandbox& sb, int port) const;
  std::string redact(std::string s) const;
  http::Request control_request(RunCtx& ctx, std::string method, std::string path, std::string body) const;

  // Taking a sandbox. acquire: the sandbox the run holds, or, when the
  // daemon has no room (max_sandboxes in use, none idle to evict), an ok
  // null: busy, which refuses the run instead of failing it. refresh:
  // extends a sandbox's TTL; Refresh::gone when E2B no longer knows it
  // (404), which is no failure: its callers forget it and look further.
  // adopt: a running sandbox an earlier daemon left, or an ok null when
  // there is none (acquire then creates one; a failure of adopt's own calls
  // ends the run). create: a new sandbox.
  enum class Refresh { extended, gone };
  Step<std::shared_ptr<Sandbox>> acquire(RunCtx& ctx);
  Step<Refresh> refresh(RunCtx& ctx, Sandbox& sb);
  Step<std::shared_ptr<Sandbox>> adopt(RunCtx& ctx);
  Step<std::shared_ptr<Sandbox>> create(RunCtx& ctx);
  // Inside it: one package installed through envd's process API (argv,
  // never a shell: a pip requirement, a TypeScript tool's npm requirement,
  // or Letta's client package for TypeScript tools); a new kernel context
  // of a language (its id); deleting one (only whether it worked: a failure
  // kills the sandbox, the run stands); a cell through /execute (`ex`: what
  // the stream carried, also when it failed).
  struct Install;
  Step<void> install(RunCtx& ctx, Sandbox& sb, const Install& what);
  Step<std::string> new_context(RunCtx& ctx, Sandbox& sb, const char* language);
  asio::awaitable<bool> delete_context(RunCtx& ctx, Sandbox& sb, const std::string& context_id);
  struct Exec;
  Step<void> execute(RunCtx& ctx, Sandbox& sb, const std::string& code, const std::string& context_id,
                     std::chrono::milliseconds stall, Exec& ex);

  Fail fail_from_http(const RunCtx& ctx, const http::Response& r, std::string_view what, bool data_plane) const;

  // The steps of run(): the run's context; its execution in tool mode (the
  // fixed tool cell, `spec` holding the runner) or script mode (the script
  // in a fresh kernel context), which fill `printed` also when they fail;
  // what a failure leaves in the record.
  struct Printed {
    std::string out, err;  // what the tool printed
  };
  RunCtx run_context(const PreparedRun& p, const std::string& config_state) const;
  Step<void> run_tool_cell(RunCtx& ctx, Sandbox& sb, PreparedRun& p, nlohmann::json spec, BackendRun& out,
                           Printed& printed);
  // A TypeScript tool in tool mode: a fresh TypeScript context, the
  // environment cell, the tool's source, the fixed call cell; the context is
  // deleted after (if that fails, `sb` is released killed and set to null).
  Step<void> run_ts_tool_cells(RunCtx& ctx, std::shared_ptr<Sandbox>& sb, PreparedRun& p, BackendRun& out,
                               Printed& printed);
  // npm requirements, then Letta's client package, for a TypeScript tool.
  Step<void> npm_installs(RunCtx& ctx, Sandbox& sb, PreparedRun& p);
  // When the kernel context cannot be deleted after the script ran, the run
  // stands and `sb` is released killed (and set to null).
  Step<void> run_script_cell(RunCtx& ctx, std::shared_ptr<Sandbox>& sb, PreparedRun& p, BackendRun& out,
                             Printed& printed);
  void record_failure(const RunCtx& ctx, const Fail& fail, BackendRun& out, const Printed& printed) const;
  void release(const std::shared_ptr<Sandbox>& sb, bool kill, std::string_view why);
  void kill_later(std::string sandbox_id, std::string why);

  asio::io_context& io_;
  E2BConfig cfg_;
  std::string api_key_;
  http::Client http_;
  std::map<std::string, std::shared_ptr<Sandbox>> pool_;  // by sandbox id: idle and in use
  std::set<std::string> adopting_;
  std::set<std::string> created_ids_;  // live sandboxes this daemon created or adopted: never adopted again
  unsigned creating_ = 0;
  unsigned creates_in_flight_ = 0;
  unsigned in_flight_ = 0;
  unsigned background_ = 0;
  bool stopping_ = false;
  std::set<std::shared_ptr<http::CancelSignal>> running_;
  std::map<std::string, std::uint64_t> counters_;
};

}  // namespace tsb::core
