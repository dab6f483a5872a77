#include "daemon/core/letta_result.h"

#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>

#include "daemon/policy/units.h"
#include "protocol/json_scan.h"
#include "protocol/letta.h"

namespace tsb::core {
namespace {

using nlohmann::json;
using isolate::EndReason;
namespace lp = tsb::protocol;

json as_list(const std::string& s) { return s.empty() ? json::array() : json::array({s}); }

// Letta's handling of a non-zero exit without a result: the exception named
// on the last lines of stderr, or an empty name and message when none is.
std::string failure_from_stderr(const std::string& tool, const std::string& stderr_text,
                                const std::string& fallback_name, const std::string& fallback_msg) {
  auto [name, msg] = lp::parse_stderr_error_msg(stderr_text, 3);
  if (name.empty() && !fallback_name.empty()) return lp::friendly_error_msg(tool, fallback_name, fallback_msg);
  return lp::friendly_error_msg(tool, name, msg);
}

std::string signal_text(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return std::string("the tool was killed by signal ") + std::to_string(sig) + (abbrev ? std::string(" (SIG") + abbrev + ")" : "");
}

}  // namespace

std::string runner_request_text(const protocol::RunToolRequest& t, std::string_view nonce,
                                const std::map<std::string, std::string>& env) {
  const auto& c = t.common;
  // The runner gives agent_state only to a function that declares it, which
  // it decides from the syntax tree; a source without the word cannot
  // declare it, so the state (the agent's secrets) is not sent at all.
  // This matters where the request is decoded by code the tool may read
  // (an E2B sandbox's kernel); locally the runner's parent holds it.
  std::size_t env_size = 2;  // {}
  for (const auto& [k, v] : env) env_size += lp::json_quoted_size(k) + 1 + lp::json_quoted_size(v) + 1;
  if (!env.empty()) --env_size;  // no comma after the last
  const std::string_view agent_state =
      t.source_code.find("agent_state") == std::string::npos ? std::string_view("null") : std::string_view(t.agent_state);
  struct Part {
    std::string_view name;  // with its quotes, colon and leading separator
    std::size_t size;
  };
  const Part parts[] = {
      {"{\"nonce\":", lp::json_quoted_size(nonce)},
      {",\"tool_name\":", lp::json_quoted_size(c.tool_name)},
      {",\"source_code\":", lp::json_quoted_size(t.source_code)},
      {",\"args\":", t.args.size()},
      {",\"json_schema\":", t.json_schema.size()},
      {",\"agent_state\":", agent_state.size()},
      {",\"agent_id\":", c.agent_id ? lp::json_quoted_size(*c.agent_id) : std::string_view("null").size()},
      {",\"env\":", env_size},
  };
  std::size_t size = 1;  // the closing brace
  for (const Part& p : parts) size += p.name.size() + p.size;
  // Sized exactly once: for a request of tens of megabytes a growing string
  // would briefly hold two copies.
  std::string out;
  out.reserve(size);
  out += parts[0].name;
  lp::append_json_quoted(out, nonce);
  out += parts[1].name;
  lp::append_json_quoted(out, c.tool_name);
  out += parts[2].name;
  lp::append_json_quoted(out, t.source_code);
  out += parts[3].name;
  out += t.args;
  out += parts[4].name;
  out += t.json_schema;
  out += parts[5].name;
  out += agent_state;
  out += parts[6].name;
  if (c.agent_id) lp::append_json_quoted(out, *c.agent_id);
  else out += "null";
  out += parts[7].name;
  out += '{';
  for (auto it = env.begin(); it != env.end(); ++it) {
    if (it != env.begin()) out += ',';
    lp::append_json_quoted(out, it->first);
    out += ':';
    lp::append_json_quoted(out, it->second);
  }
  out += '}';
  out += '}';
  return out;
}

std::string python_float_str(double v) {
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 1e16) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.1f", v);
    return buf;
  }
  // Shortest representation that round-trips, as repr() does.
  for (int prec = 1; prec <= 17; ++prec) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*g", prec, v);
    if (std::strtod(buf, nullptr) == v) return buf;
  }
  return std::to_string(v);
}

Shaped shape_tool_result(const ShapeContext& ctx, const isolate::RunResult& run, const DecodedPickle* decoded) {
  Shaped out;
  json& r = out.result;
  const std::string& name = ctx.tool_name;
  r = {{"status", "error"},
       {"func_return", nullptr},
       {"agent_state", nullptr},
       {"stdout", json::array()},
       {"stderr", json::array()},
       {"sandbox_config_fingerprint", ctx.fingerprint ? json(*ctx.fingerprint) : json()}};

  // Runs that did not end on their own: Letta raises in these cases and its
  // manager reports get_friendly_error_msg(name, type(e).__name__, str(e)).
  auto fail = [&](const std::string& exc, const std::string& msg) {
    r["func_return"] = lp::friendly_error_msg(name, exc, msg);
    r["stdout"] = as_list(run.stdout_data);
    json err = as_list(run.stderr_data);
    err.push_back(exc + ": " + msg);
    r["stderr"] = err;
  };
  switch (run.reason) {
    case EndReason::SetupFailed:
      fail("SandboxError", run.error.empty() ? "the sandbox could not be built" : run.error);
      return out;
    case EndReason::Timeout:
      fail("TimeoutError", "Executing tool " + name + " timed out after " + python_float_str(ctx.timeout_s) + " seconds.");
      return out;
    case EndReason::CpuLimit:
      fail("TimeoutError", "Executing tool " + name + " used up its CPU time limit.");
      return out;
    case EndReason::MemoryLimit:
      fail("MemoryError", "Executing tool " + name + " exceeded the memory limit" +
                              (ctx.memory_limit ? " of " + format_size(ctx.memory_limit) : std::string()) + ".");
      return out;
    case EndReason::OutputLimit:
      fail("RuntimeError", "Executing tool " + name + " produced more output than allowed.");
      return out;
    case EndReason::Cancelled:
      fail("CancelledError", "Execution cancelled.");
      return out;
    case EndReason::PidsLimit:
      if (run.exit_code != 0) {
        r["func_return"] = failure_from_stderr(name, run.stderr_data, "RuntimeError",
                                               "Executing tool " + name + " hit the process limit" +
                                                   (ctx.pids_limit ? " of " + std::to_string(ctx.pids_limit) : std::string()) + ".");
        r["stdout"] = as_list(run.stdout_data);
        r["stderr"] = as_list(run.stderr_data);
        return out;
      }
      break;
    case EndReason::Exited:
    case EndReason::Signaled:
      break;
  }

  // Letta decodes stderr, then stdout without its frame, as strict UTF-8;
  // invalid bytes raise UnicodeDecodeError there, which its sandbox answers
  // as an internal error: status "error", no stdout, the message as stderr.
  const bool letta_strict_utf8 = ctx.tool_mode || ctx.generation == lp::ScriptGeneration::kCurrent;
  const auto decode_failure = [&](const std::string& message) {
    r["func_return"] = lp::friendly_error_msg(name, "UnicodeDecodeError", message);
    r["stdout"] = json::array({""});
    r["stderr"] = json::array({message});
    out.extra["utf8_error"] = message;
    return out;
  };
  if (letta_strict_utf8)
    if (auto e = lp::python_utf8_decode_error(run.stderr_data)) return decode_failure(*e);

  const bool success_exit = run.reason == EndReason::Exited && run.exit_code == 0;
  const std::string fallback_name = run.reason == EndReason::Signaled ? "RuntimeError" : "";
  const std::string fallback_msg = run.reason == EndReason::Signaled ? signal_text(run.signal) : "";

  if (!ctx.tool_mode) {
    lp::ParsedOutput p = lp::parse_letta_stdout(run.stdout_data, ctx.generation);
    out.extra["framing"] = std::string(lp::framing_name(p.framing));
    if (p.stdout_invalid_utf8) out.extra["stdout_invalid_utf8"] = true;
    // Letta decodes the stdout around a frame whose md5 matched before it
    // parses the payload: there the decode error comes first.
    if (letta_strict_utf8 && p.corrupted && p.frame_verified && p.stdout_decode_error)
      return decode_failure(*p.stdout_decode_error);
    if (p.corrupted) {
      // Letta's "internal error" shape (local_sandbox.py:233-251).
      r["func_return"] = lp::friendly_error_msg(name, p.error_name, p.error_message);
      // Letta raises before it has any stdout text: [""]. For scripts of
      // neither generation the output is kept.
      r["stdout"] = json::array({letta_strict_utf8 ? std::string() : p.stdout_text});
      r["stderr"] = json::array({p.error_message});
      return out;
    }
    if (letta_strict_utf8 && p.stdout_decode_error) return decode_failure(*p.stdout_decode_error);
    if (p.opaque_pickle) {
      out.extra["opaque_pickle"] = true;
      r["stdout"] = as_list(p.stdout_text);
      r["stderr"] = as_list(run.stderr_data);
      const lp::NonceFrame* f = decoded && decoded->frame ? &*decoded->frame : nullptr;
      if (f && !f->error) {
        // What letta-server's pickle.loads gave it, as plain data.
        out.extra["pickle_decoded"] = true;
        r["status"] = success_exit ? "success" : "error";
        r["func_return"] = f->results;
        r["agent_state"] = f->agent_state;
        out.func_return_text = f->results_text;
        if (!f->agent_state.is_null()) out.agent_state_text = f->agent_state_text;
        return out;
      }
      out.extra["payload_base64"] = p.opaque_payload_base64;
      if (ctx.json_result_script) {
        // A JSON generator's frame that holds no JSON was written by the
        // tool: Letta's parser raises decoding it (its internal-error shape).
        auto raw = lp::b64decode_validate(p.opaque_payload_base64);
        auto utf8 = raw.ok() ? lp::python_utf8_decode_error(*raw) : std::nullopt;
        const std::string exc = utf8 ? "UnicodeDecodeError" : "JSONDecodeError";
        const std::string msg = utf8 ? *utf8 : "the result frame's payload is not JSON";
        r["func_return"] = lp::friendly_error_msg(name, exc, msg);
        r["stdout"] = json::array({p.stdout_text});
        r["stderr"] = json::array({msg});
        out.extra["pickle_error"] = exc + ": " + msg;
        return out;
      }
      if (f) {
        // pickle.loads (or the server's result["results"]) raised this:
        // Letta's manager reports the exception.
        out.extra["pickle_error"] = f->error->name + ": " + f->error->message;
        r["func_return"] = lp::friendly_error_msg(name, f->error->name, f->error->message);
        r["stderr"].push_back(f->error->name + ": " + f->error->message);
        return out;
      }
      const std::string why = decoded ? "the pickle payload could not be decoded: " + decoded->failure
                                       : "the result is a pickle payload, which toolsandboxd decodes only in a local sandbox";
      if (decoded) out.extra["pickle_error"] = decoded->failure;
      r["func_return"] = lp::friendly_error_msg(name, "Exception", why);
      return out;
    }
    r["stdout"] = as_list(p.stdout_text);
    r["stderr"] = as_list(run.stderr_data);
    r["status"] = success_exit ? "success" : "error";
    if (p.usable()) {
      r["func_return"] = p.results;
      r["agent_state"] = p.agent_state;
      out.func_return_text = p.results_text;
      if (!p.agent_state.is_null()) out.agent_state_text = p.agent_state_text;
    }
    if (!success_exit && !p.found()) r["func_return"] = failure_from_stderr(name, run.stderr_data, fallback_name, fallback_msg);
    return out;
  }

  // Tool mode: only the frame carrying this run's nonce counts.
  out.extra["framing"] = "nonce";
  auto frame = lp::extract_nonce_frame(run.stdout_data, ctx.nonce);
  if (!frame.ok()) {
    r["func_return"] = lp::friendly_error_msg(name, "Exception", std::string(lp::kCorruptedOutputMessage));
    r["stdout"] = json::array({run.stdout_data});
    r["stderr"] = json::array({frame.error().message});
    out.extra["frame_error"] = frame.error().message;
    return out;
  }
  if (!frame->has_value()) {
    // The runner never wrote its frame: it was killed, or the tool killed it.
    if (auto e = lp::python_utf8_decode_error(run.stdout_data)) return decode_failure(*e);
    r["stdout"] = as_list(run.stdout_data);
    r["stderr"] = as_list(run.stderr_data);
    r["func_return"] = failure_from_stderr(name, run.stderr_data, fallback_name.empty() ? "RuntimeError" : fallback_name,
                                           fallback_msg.empty() ? "the tool ended without returning a result" : fallback_msg);
    return out;
  }
  const lp::NonceFrame& f = **frame;
  if (f.stdout_invalid_utf8) out.extra["stdout_invalid_utf8"] = true;
  if (f.stdout_decode_error) return decode_failure(*f.stdout_decode_error);
  r["stdout"] = as_list(f.stdout_text);
  r["stderr"] = as_list(run.stderr_data);
  if (f.error) {
    out.extra["error_kind"] = f.error->kind;
    // What the tool raised is read from stderr exactly as Letta reads its
    // script's (an exception with an empty or multi-line message, or a class
    // not named ...Error, gives Letta's text); what the runner found itself
    // (a missing function, an argument not in the schema, a dead process)
    // is said as it is.
    r["func_return"] = f.error->raised ? failure_from_stderr(name, run.stderr_data, "", "")
                                       : lp::friendly_error_msg(name, f.error->name, f.error->message);
    return out;
  }
  r["status"] = success_exit ? "success" : "error";
  r["func_return"] = f.results;
  r["agent_state"] = f.agent_state;
  out.func_return_text = f.results_text;
  if (!f.agent_state.is_null()) out.agent_state_text = f.agent_state_text;
  return out;
}

std::optional<std::string> pickle_payload_to_decode(const ShapeContext& ctx, const isolate::RunResult& run) {
  // Most runs have no frame marker at all: no shaping for them.
  if (ctx.tool_mode || ctx.json_result_script ||
      (run.stdout_data.find(lp::kBinaryMarker) == std::string::npos &&
       run.stdout_data.find(lp::kLegacyStartMarker) == std::string::npos))
    return std::nullopt;
  Shaped s = shape_tool_result(ctx, run);
  if (!s.extra.contains("opaque_pickle") || !s.extra.contains("payload_base64")) return std::nullopt;
  return s.extra["payload_base64"].get<std::string>();
}

}  // namespace tsb::core
