#include "daemon/frontend/pipeline/pipeline.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "protocol/record.h"
#include "daemon/policy/units.h"
#include "isolate/base/random.h"
#include "daemon/policy/jsonc.h"
#include "protocol/json_scan.h"
#include "daemon/frontend/letta/letta.h"
#include "daemon/compile/spawn_policy.h"
#include "daemon/frontend/letta/pyjson.h"

namespace tsb::core {

std::optional<Refusal> checked_pip_set(const RequirementRules& rules, const Policy& pol,
                                       const std::vector<std::string>& names, std::string_view per,
                                       venv::RequirementSet& out) {
  if (names.size() > rules.max)
    return Refusal{protocol::ErrorCode::BadRequest, "policy " + quoted_for_message(pol.name) + " allows at most " + std::to_string(rules.max) +
                                              " pip requirements per " + std::string(per) + " (" +
                                              std::to_string(names.size()) + " given)"};
  auto set = venv::canonical_set(names, rules.allow_urls);
  if (!set.ok()) {
    const int code = set.error().code;
    std::string why = std::move(set).error().message;
    if (code == venv::kUrlRefused && !rules.urls_hint.empty()) why += " (" + rules.urls_hint + ")";
    return Refusal{code == EINVAL ? protocol::ErrorCode::BadRequest : protocol::ErrorCode::PolicyDenied, std::move(why)};
  }
  out = std::move(set).value();
  if (!rules.allow.empty())
    if (std::string no = venv::first_not_allowed(out, rules.allow); !no.empty())
      return Refusal{protocol::ErrorCode::PolicyDenied,
                     "pip requirement " + quoted_for_message(no) + " is not allowed by policy " + quoted_for_message(pol.name) + " (packages.allow)"};
  return std::nullopt;
}

std::optional<Refusal> checked_npm_set(const TypeScriptRules& rules, const Policy& pol,
                                       const std::vector<std::string>& names, std::string_view per,
                                       std::vector<venv::NpmRequirement>& out) {
  if (names.size() > rules.max_npm)
    return Refusal{protocol::ErrorCode::BadRequest, "policy " + quoted_for_message(pol.name) + " allows at most " + std::to_string(rules.max_npm) +
                                              " npm requirements per " + std::string(per) + " (" +
                                              std::to_string(names.size()) + " given)"};
  auto set = venv::canonical_npm_set(names);
  if (!set.ok()) {
    const int code = set.error().code;
    return Refusal{code == venv::kNpmForbidden ? protocol::ErrorCode::PolicyDenied : protocol::ErrorCode::BadRequest,
                   std::move(set).error().message};
  }
  out = std::move(set).value();
  if (!rules.allow.empty())
    if (std::string no = venv::first_npm_not_allowed(out, rules.allow); !no.empty())
      return Refusal{protocol::ErrorCode::PolicyDenied,
                     "npm requirement " + quoted_for_message(no) + " is not allowed by policy " + quoted_for_message(pol.name) + " (typescript.packages.allow)"};
  return std::nullopt;
}

namespace {

using nlohmann::json;
using protocol::ErrorCode;

std::string q(std::string_view s) { return quoted_for_message(s); }

// The decoder accepts only finite, positive timeouts of at most a day.
std::chrono::milliseconds seconds_to_ms(double s) { return std::chrono::milliseconds(std::llround(s * 1000.0)); }

// The run's pip requirements: its sandbox config's "pip_requirements" and
// its tool's, gathered, made canonical and checked once against what its
// backend installs under its policy (RunBackend::requirement_rules).
// `config_name`: how the request names the sandbox config, for messages.
std::optional<Refusal> prepare_requirements(PreparedRun& out, const std::string& config_name) {
  const protocol::SandboxConfig* sc = out.sandbox_config;
  const nlohmann::json* config_reqs = nullptr;
  // On E2B, only an E2B sandbox config's count (Letta's E2B sandbox reads
  // its E2BSandboxConfig's, never a local config's).
  const bool counts = sc && (out.placement.backend != Backend::E2B || sc->type == "e2b");
  if (counts && sc->config.is_object() && sc->config.contains("pip_requirements"))
    config_reqs = &sc->config["pip_requirements"];
  static const std::vector<std::string> kNone;
  auto gathered = venv::gather(
      config_reqs, out.tool_mode ? std::get<protocol::RunToolRequest>(out.request->body).pip_requirements : kNone);
  if (!gathered.ok()) return Refusal{ErrorCode::BadRequest, config_name + ".config." + gathered.error().message};
  const std::vector<std::string>& names = *gathered;
  if (names.empty()) return std::nullopt;
  const Policy& pol = out.policy();
  const RequirementRules rules = out.backend->requirement_rules(pol);
  if (!rules.refusal.empty())
    return Refusal{ErrorCode::PolicyDenied, rules.refusal + ", and this run asks for " +
                                                std::to_string(names.size()) + " pip requirement(s), the first " +
                                                q(names.front())};
  return checked_pip_set(rules, pol, names, "run", out.requirements);
}

// A TypeScript tool's checks: that the backend runs TypeScript under the
// policy, and its npm requirements, canonical and checked once. A Python
// tool has no npm requirements.
std::optional<Refusal> prepare_typescript(PreparedRun& out) {
  const protocol::CommonRunFields& c = *out.common;
  out.typescript = c.source_type == protocol::SourceType::TypeScript;
  if (!out.typescript) {
    if (!c.npm_requirements.empty())
      return Refusal{ErrorCode::BadRequest, "npm_requirements are for TypeScript tools (source_type \"typescript\")"};
    return std::nullopt;
  }
  const Policy& pol = out.policy();
  const TypeScriptRules rules = out.backend->typescript_rules(pol);
  if (!rules.refusal.empty()) return Refusal{ErrorCode::PolicyDenied, rules.refusal};
  if (!rules.pip && !out.requirements.items.empty())
    return Refusal{ErrorCode::PolicyDenied, "a TypeScript tool has no Python venv here, and this run asks for " +
                                                std::to_string(out.requirements.items.size()) +
                                                " pip requirement(s), the first " +
                                                q(out.requirements.items.front().text())};
  if (c.npm_requirements.empty()) return std::nullopt;
  if (!rules.npm_refusal.empty())
    return Refusal{ErrorCode::PolicyDenied, rules.npm_refusal + ", and this run asks for " +
                                                std::to_string(c.npm_requirements.size()) +
                                                " npm requirement(s), the first " + q(c.npm_requirements.front())};
  return checked_npm_set(rules, pol, c.npm_requirements, "run", out.npm_requirements);
}

}  // namespace

bool changes_how_a_program_starts(std::string_view name) {
  // glibc's list of variables it drops for setuid programs (UNSECURE_ENVVARS,
  // sysdeps/generic/unsecvars.h) with every LD_* and MALLOC_* name, TMPDIR
  // left out (it changes nothing at start), and Python's PYTHON*.
  static constexpr std::string_view kNamed[] = {"GCONV_PATH",  "GETCONF_DIR", "GLIBC_TUNABLES", "HOSTALIASES",
                                                "LOCALDOMAIN", "LOCPATH",     "NIS_PATH",       "NLSPATH",
                                                "RESOLV_HOST_CONF", "RES_OPTIONS", "TZDIR"};
  if (name.starts_with("LD_") || name.starts_with("MALLOC_") || name.starts_with("PYTHON")) return true;
  return std::find(std::begin(kNamed), std::end(kNamed), name) != std::end(kNamed);
}

bool read_at_start(std::string_view name) {
  return changes_how_a_program_starts(name) || name == "LANG" || name == "LANGUAGE" || name.starts_with("LC_") ||
         name == "TZ" || name == "HOME" || name.starts_with("OPENSSL_");
}

std::optional<Refusal> prepare_run(const protocol::Request& req, const Peer& peer,
                                   std::shared_ptr<const PolicySet> policies, const Backends& backends,
                                   const std::string& runner_path, PreparedRun& out) {
  out.request = &req;
  out.tool_mode = std::holds_alternative<protocol::RunToolRequest>(req.body);
  out.common = out.tool_mode ? &std::get<protocol::RunToolRequest>(req.body).common
                             : &std::get<protocol::ExecuteRequest>(req.body).common;
  const protocol::CommonRunFields& c = *out.common;
  out.peer = peer;
  out.policies = std::move(policies);

  auto placement = place_run(*out.policies, c.organization_id, c.policy, backends.e2b_configured);
  if (!placement.ok()) return Refusal{ErrorCode::PolicyDenied, placement.error().message};
  out.placement = std::move(placement).value();
  const Policy& pol = out.policy();
  out.backend = out.placement.backend == Backend::E2B ? backends.e2b : backends.local;
  if (!out.backend)
    return Refusal{ErrorCode::Unavailable, "organization " + q(c.organization_id) + " runs on " +
                                               to_string(out.placement.backend) + ", which is not configured in this daemon"};

  // A run delegated to E2B is described by the request's E2B alternative
  // where it gives one, as Letta's E2B sandbox reads the organization's E2B
  // config and that config's variables instead of the local ones.
  const protocol::E2BAlternative* alt =
      out.placement.backend == Backend::E2B && c.e2b ? &*c.e2b : nullptr;
  const bool alt_config = alt && alt->sandbox_config;
  out.sandbox_config = alt_config ? &*alt->sandbox_config : c.sandbox_config ? &*c.sandbox_config : nullptr;
  if (const protocol::SandboxConfig* sc = out.sandbox_config) {
    // Letta's SandboxConfig.fingerprint() uses the config's own organization.
    // Sent as null: it has none, and Letta hashes None.
    std::optional<std::string_view> org = sc->organization_id ? *sc->organization_id : c.organization_id;
    if (sc->organization_null) org = std::nullopt;
    auto fp = letta::sandbox_config_fingerprint(sc->type, org, sc->config);
    if (!fp.ok())
      return Refusal{ErrorCode::BadRequest, std::string(alt_config ? "e2b." : "") + "sandbox_config: " +
                                                fp.error().message};
    out.fingerprint = *fp;
  }

  if (auto refused = prepare_requirements(out, alt_config ? "e2b.sandbox_config" : "sandbox_config"))
    return refused;
  if (auto refused = prepare_typescript(out)) return refused;

  // The tool's environment: the policy's fixed values plus the request's,
  // for names the policy allows. Never the daemon's own environment.
  out.env = alt && alt->env ? *alt->env : c.env;
  if (c.agent_id) out.env["LETTA_AGENT_ID"] = *c.agent_id;
  if (c.project_id) out.env["LETTA_PROJECT_ID"] = *c.project_id;
  // A name the policy fixes keeps the policy's value, as a Letta sandbox
  // config's LANG, HOME, PATH or TERM would otherwise refuse the whole call;
  // the record names what was overridden. A name the policy does not allow
  // still refuses the run.
  for (auto it = out.env.begin(); it != out.env.end();) {
    if (pol.env_set.count(it->first) == 0) {
      ++it;
      continue;
    }
    out.env_overridden.push_back(it->first);
    it = out.env.erase(it);
  }
  auto envv = build_environment(pol, out.env);
  if (!envv.ok()) return Refusal{ErrorCode::PolicyDenied, envv.error().message};
  out.sandbox_env = std::move(envv).value();
  if (out.tool_mode) {
    // Variables that change how a program starts (the dynamic loader's,
    // glibc's, Python's) reach the tool, not the trusted runner: the runner
    // starts without them and its tool process sets them (runner_env).
    // Checked against the policy above like any other.
    for (auto it = out.env.begin(); it != out.env.end();) {
      if (!changes_how_a_program_starts(it->first)) {
        ++it;
        continue;
      }
      out.runner_env.insert(out.env.extract(it++));
    }
    if (!out.runner_env.empty()) {
      auto clean = build_environment(pol, out.env);
      if (!clean.ok()) return Refusal{ErrorCode::PolicyDenied, clean.error().message};
      out.sandbox_env = std::move(clean).value();
    }
  }

  // A request may lower the policy's wall-clock limit, never raise it.
  out.timeout = pol.limits.wall_timeout;
  out.timeout_requested_s = c.timeout_s;
  const bool lowered = c.timeout_s && seconds_to_ms(*c.timeout_s) <= pol.limits.wall_timeout;
  if (c.timeout_s && seconds_to_ms(*c.timeout_s) < out.timeout)
    out.timeout = std::max(seconds_to_ms(*c.timeout_s), std::chrono::milliseconds(1));

  out.shape.tool_name = c.tool_name;
  out.shape.timeout_s = lowered ? *c.timeout_s : pol.limits.wall_timeout.count() / 1000.0;
  out.shape.fingerprint = out.fingerprint;
  out.shape.tool_mode = out.tool_mode;
  if (!out.tool_mode) {
    const std::string& script = std::get<protocol::ExecuteRequest>(req.body).script;
    out.shape.generation = letta::detect_script_generation(script);
    out.shape.json_result_script = letta::script_writes_json_result(script);
  }
  out.shape.memory_limit = pol.limits.memory_bytes;
  out.shape.pids_limit = pol.limits.pids;

  out.runner_path = runner_path;
  if (out.tool_mode) {
    if (runner_path.empty()) return Refusal{ErrorCode::Internal, "the tool runner is not installed on this host"};
    // A local sandbox's runner answers on its result channel, built by the
    // backend; an E2B cell's in a frame marked with a fresh nonce.
    out.shape.channel = out.placement.backend == Backend::Local;
    out.shape.result_cap = pol.result_bytes;
    if (!out.shape.channel) {
      out.shape.nonce = random_hex(16);
      out.shape.may_declare = source_may_declare_agent_state(std::get<protocol::RunToolRequest>(req.body).source_code);
      out.runner_request = runner_request_text(std::get<protocol::RunToolRequest>(req.body), out.shape.nonce, out.runner_env);
    }
  }
  // A local TypeScript run answers on its result channel in both modes
  // (isolate/runner/toolsandbox_ts_runner.js).
  out.shape.typescript = out.typescript;
  if (out.typescript && out.placement.backend == Backend::Local) {
    out.shape.channel = true;
    out.shape.result_cap = pol.limits.stdout_bytes;
  }
  if (!out.cancel) out.cancel = std::make_shared<CancelSignal>();
  if (!out.client_gone) out.client_gone = [] { return false; };
  return std::nullopt;
}

std::string finish_run(const PreparedRun& p, std::string_view backend, BackendRun& out,
                       std::chrono::steady_clock::duration took, std::string* ended) {
  const protocol::CommonRunFields& c = *p.common;
  const Policy& pol = p.policy();
  json result, record = run_record_json(out.run);
  // func_return and agent_state as the exact text the tool's Python wrote,
  // in the client's dialect (messages.h, CommonRunFields::python_json).
  std::map<std::string, std::string> exact;
  auto keep = [&](const char* key, const std::string& text) {
    if (!text.empty()) exact[key] = c.python_json ? text : letta::python_json_as_strict(text);
  };
  Shaped shaped = out.failure ? shape_failure(p.shape, out.run, *out.failure)
                  : out.cell  ? shape_cell(p.shape, *out.cell)
                              : shape_tool_result(p.shape, out.run, out.decoded ? &*out.decoded : nullptr,
                                                  out.channel ? &*out.channel : nullptr);
  result = std::move(shaped.result);
  for (auto it = shaped.extra.begin(); it != shaped.extra.end(); ++it) record[it.key()] = it.value();
  keep("func_return", shaped.func_return_text);
  keep("agent_state", shaped.agent_state_text);
  for (auto it = out.record.begin(); it != out.record.end(); ++it) record[it.key()] = it.value();
  const std::string end_reason = out.end_reason.empty() ? std::string(isolate::to_string(out.run.reason)) : out.end_reason;
  record["end_reason"] = end_reason;
  record["policy"] = pol.name;
  record["policy_fingerprint"] = pol.fingerprint;
  record["backend"] = std::string(backend);
  record["timeout_applied_s"] = std::chrono::duration<double>(p.timeout).count();
  record["timeout_requested_s"] = p.timeout_requested_s ? json(*p.timeout_requested_s) : json(nullptr);
  if (!p.env_overridden.empty()) record["env_overridden"] = p.env_overridden;
  result["record"] = record;
  if (ended) *ended = end_reason;

  const auto ms = std::chrono::duration<double, std::milli>(took).count();
  const json& exit_code = record["exit_code"];
  // One audit line per run. Client strings are quoted with every control
  // character escaped; env values and agent_state never appear.
  spdlog::info(
      "audit run_id={} request_id={} peer_uid={} peer_pid={} org={} tool={} mode={} policy={} policy_fingerprint={} "
      "backend={}{} duration_ms={:.1f} end_reason={} exit_code={} status={} stdout_bytes={} stderr_bytes={}",
      out.run.run_id.empty() ? "-" : out.run.run_id, q(p.request->id), p.peer.uid, p.peer.pid, q(c.organization_id),
      q(c.tool_name), p.tool_mode ? "run_tool" : "execute", q(pol.name), pol.fingerprint, backend, out.audit, ms,
      end_reason, exit_code.is_number_integer() ? std::to_string(exit_code.get<int>()) : "-",
      result.value("status", "error"), out.run.stdout_total_bytes, out.run.stderr_total_bytes);
  return protocol::encode_ok(p.request->id, "result", result, exact);
}

}  // namespace tsb::core
