#include "daemon/frontend/letta/result.h"

#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <variant>

#include "daemon/policy/units.h"
#include "protocol/json_limits.h"
#include "protocol/json_scan.h"
#include "daemon/frontend/letta/letta.h"
#include "daemon/frontend/letta/pyjson.h"

namespace tsb::core {
namespace {

using nlohmann::json;
using isolate::EndReason;
namespace lp = tsb::letta;

json as_list(const std::string& s) { return s.empty() ? json::array() : json::array({s}); }

// A ToolExecutionResult (Letta's letta/schemas/tool_execution_result.py):
// every result the daemon answers is made here, an error until shaped.
json tool_execution_result(const ShapeContext& ctx) {
  return {{"status", "error"},
          {"func_return", nullptr},
          {"agent_state", nullptr},
          {"stdout", json::array()},
          {"stderr", json::array()},
          {"sandbox_config_fingerprint", ctx.fingerprint ? json(*ctx.fingerprint) : json()}};
}

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

namespace {

// One member of a JSON object built by object_text: its value JSON-quoted
// (a string), or spliced in as it is (JSON text: the client's args,
// json_schema and agent_state, so no value is re-encoded and numbers stay as
// written).
struct Member {
  std::string_view name;
  std::string_view value;
  bool quoted = false;
};

// {"name":value,...}, sized exactly once (for a request of tens of
// megabytes a growing string would briefly hold two copies); as a part of
// the result channel, its header first.
std::string object_text(std::initializer_list<Member> members, bool channel_part = false) {
  std::size_t size = 2 + (members.size() ? members.size() - 1 : 0);  // braces, commas
  for (const Member& m : members)
    size += protocol::json_quoted_size(m.name) + 1 + (m.quoted ? protocol::json_quoted_size(m.value) : m.value.size());
  std::string out;
  out.reserve(size + (channel_part ? 4 : 0));
  if (channel_part) out = lp::channel_part_header(size);
  out += '{';
  for (const Member& m : members) {
    if (&m != members.begin()) out += ',';
    protocol::append_json_quoted(out, m.name);
    out += ':';
    if (m.quoted) protocol::append_json_quoted(out, m.value);
    else out += m.value;
  }
  out += '}';
  return out;
}

std::string env_text(const std::map<std::string, std::string>& env) {
  std::string out = "{";
  for (const auto& [k, v] : env) {
    if (out.size() > 1) out += ',';
    protocol::append_json_quoted(out, k);
    out += ':';
    protocol::append_json_quoted(out, v);
  }
  return out += '}';
}

Member agent_id_member(const protocol::CommonRunFields& c) {
  return c.agent_id ? Member{"agent_id", *c.agent_id, true} : Member{"agent_id", "null"};
}

}  // namespace

bool source_may_declare_agent_state(std::string_view source) {
  return source.find("agent_state") != std::string_view::npos;
}

std::string runner_request_text(const protocol::RunToolRequest& t, std::string_view nonce,
                                const std::map<std::string, std::string>& env) {
  // The runner gives agent_state only to a function that declares it, which
  // it decides from the syntax tree; a source without the word cannot
  // declare it, so the state (the agent's secrets) is not sent at all.
  // This matters where the request is decoded by code the tool may read
  // (an E2B sandbox's kernel).
  const bool may_declare = source_may_declare_agent_state(t.source_code);
  const std::string env_json = env_text(env);
  return object_text({{"nonce", nonce, true},
                      {"tool_name", t.common.tool_name, true},
                      {"source_code", t.source_code, true},
                      {"args", t.args},
                      {"json_schema", t.json_schema},
                      {"agent_state", may_declare ? std::string_view(t.agent_state) : "null"},
                      agent_id_member(t.common),
                      {"env", env_json}});
}

std::string runner_channel_first(const protocol::RunToolRequest& t) {
  return object_text({{"tool_name", t.common.tool_name, true}, {"source_code", t.source_code, true}}, true);
}

std::string runner_channel_second(const protocol::RunToolRequest& t, bool declared,
                                  const std::map<std::string, std::string>& env) {
  const std::string env_json = env_text(env);
  return object_text({{"args", t.args},
                      {"json_schema", t.json_schema},
                      {"agent_state", declared ? std::string_view(t.agent_state) : "null"},
                      agent_id_member(t.common),
                      {"env", env_json}},
                     true);
}

std::string runner_channel_script(std::string_view script) {
  return object_text({{"script", script, true}}, true);
}

std::string runner_channel_unpickle(std::string_view payload_base64) {
  return object_text({{"unpickle", payload_base64, true}}, true);
}

std::string runner_environ_part(const std::map<std::string, std::string>& environ) {
  const std::string env_json = env_text(environ);
  return object_text({{"environ", env_json}}, true);
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

namespace {

// One shaping in progress: the run, what shapes it, and the result being
// made (an error until a step says otherwise). Each step below ends in one
// of the answers here, or in its own; an answer moves the result out (a
// tool's output can be megabytes), so nothing reads `out` after one.
struct Shaping {
  const ShapeContext& ctx;
  const isolate::RunResult& run;
  Shaped out;

  json& r() { return out.result; }
  const std::string& name() const { return ctx.tool_name; }
  bool success_exit() const { return run.reason == EndReason::Exited && run.exit_code == 0; }
  // Letta's current sandbox decodes stderr, then stdout without its frame,
  // as strict UTF-8; invalid bytes raise UnicodeDecodeError there, which it
  // answers as an internal error. (Tool mode's result never passes through
  // the output, nor a TypeScript run's: their output is decoded as
  // errors="replace" would, up front.)
  bool strict_utf8() const {
    return !ctx.typescript && !ctx.tool_mode && ctx.generation == lp::ScriptGeneration::kCurrent;
  }
  // What a run killed by a signal and without a result is said to have raised.
  std::string fallback_name() const { return run.reason == EndReason::Signaled ? "RuntimeError" : ""; }
  std::string fallback_msg() const { return run.reason == EndReason::Signaled ? signal_text(run.signal) : ""; }

  // A run that did not end on its own: Letta raises, and its manager
  // reports get_friendly_error_msg(name, type(e).__name__, str(e)).
  Shaped raised(const std::string& exc, const std::string& msg) {
    r()["func_return"] = lp::friendly_error_msg(name(), exc, msg);
    r()["stdout"] = as_list(run.stdout_data);
    json err = as_list(run.stderr_data);
    err.push_back(exc + ": " + msg);
    r()["stderr"] = err;
    return std::move(out);
  }
  // Undecodable output: status "error", no stdout, the message as stderr.
  Shaped decode_failure(const std::string& message) {
    r()["func_return"] = lp::friendly_error_msg(name(), "UnicodeDecodeError", message);
    r()["stdout"] = json::array({""});
    r()["stderr"] = json::array({message});
    out.extra["utf8_error"] = message;
    return std::move(out);
  }
  // Tool mode: what claims to be the runner's result is not.
  Shaped corrupted(const std::string& why) {
    r()["func_return"] = lp::friendly_error_msg(name(), "Exception", std::string(lp::kCorruptedOutputMessage));
    r()["stdout"] = json::array({run.stdout_data});
    r()["stderr"] = json::array({why});
    out.extra["frame_error"] = why;
    return std::move(out);
  }
  // Tool mode: the runner never sent its result (it was killed, or the tool
  // killed it or ended its process first).
  Shaped no_result(const ChannelOutcome* channel) {
    r()["stdout"] = as_list(run.stdout_data);
    r()["stderr"] = as_list(run.stderr_data);
    if (ctx.channel && success_exit() && channel && channel->declared) {
      // Status 0 with no result (os._exit(0) in the tool): Letta's script
      // ended with status 0 before writing one, a success returning None.
      r()["status"] = "success";
      return std::move(out);
    }
    std::string why = fallback_msg();
    if (why.empty())
      why = ctx.channel && run.reason == EndReason::Exited
                ? "the tool's process exited with status " + std::to_string(run.exit_code) + " before returning a result"
                : "the tool ended without returning a result";
    r()["func_return"] =
        failure_from_stderr(name(), run.stderr_data, fallback_name().empty() ? "RuntimeError" : fallback_name(), why);
    return std::move(out);
  }
};

// The run was stopped (a limit, a timeout, a set-up failure, the client):
// the exception Letta raises for it. Nothing when it ended on its own.
std::optional<Shaped> shape_stopped(Shaping& s) {
  const std::string& name = s.name();
  const ShapeContext& ctx = s.ctx;
  switch (s.run.reason) {
    case EndReason::SetupFailed:
      return s.raised("SandboxError", s.run.error.empty() ? "the sandbox could not be built" : s.run.error);
    case EndReason::Timeout:
      return s.raised("TimeoutError",
                      "Executing tool " + name + " timed out after " + python_float_str(ctx.timeout_s) + " seconds.");
    case EndReason::CpuLimit: return s.raised("TimeoutError", "Executing tool " + name + " used up its CPU time limit.");
    case EndReason::MemoryLimit:
      return s.raised("MemoryError", "Executing tool " + name + " exceeded the memory limit" +
                                         (ctx.memory_limit ? " of " + format_size(ctx.memory_limit) : std::string()) + ".");
    case EndReason::OutputLimit:
      return s.raised("RuntimeError", "Executing tool " + name + " produced more output than allowed.");
    case EndReason::Cancelled: return s.raised("CancelledError", "Execution cancelled.");
    case EndReason::PidsLimit:
      if (s.run.exit_code == 0) break;
      s.r()["func_return"] =
          failure_from_stderr(name, s.run.stderr_data, "RuntimeError",
                              "Executing tool " + name + " hit the process limit" +
                                  (ctx.pids_limit ? " of " + std::to_string(ctx.pids_limit) : std::string()) + ".");
      s.r()["stdout"] = as_list(s.run.stdout_data);
      s.r()["stderr"] = as_list(s.run.stderr_data);
      return std::move(s.out);
    case EndReason::Exited:
    case EndReason::Signaled: break;
  }
  return std::nullopt;
}

// Script mode, a pickle payload (a script Letta generated before JSON):
// its decoding by the runner in a sandbox of its own, when there is one.
Shaped shape_pickle(Shaping& s, const lp::ParsedOutput& p, const DecodedPickle* decoded) {
  json& r = s.r();
  Shaped& out = s.out;
  out.extra["opaque_pickle"] = true;
  r["stdout"] = as_list(p.stdout_text);
  r["stderr"] = as_list(s.run.stderr_data);
  const lp::NonceFrame* f = decoded && decoded->frame ? &*decoded->frame : nullptr;
  if (f && !f->error) {
    // What letta-server's pickle.loads gave it, as plain data.
    out.extra["pickle_decoded"] = true;
    // Which values were tuples, sets, bytes, keys of other types: for a
    // client to rebuild what letta-server's pickle.loads gave it.
    if (!f->types.is_null()) out.extra["pickle_types"] = f->types;
    if (f->types_omitted) out.extra["pickle_types_omitted"] = true;
    r["status"] = s.success_exit() ? "success" : "error";
    r["func_return"] = f->results;
    r["agent_state"] = f->agent_state;
    out.func_return_text = f->results_text;
    if (!f->agent_state.is_null()) out.agent_state_text = f->agent_state_text;
    return std::move(out);
  }
  out.extra["payload_base64"] = p.opaque_payload_base64;
  if (s.ctx.json_result_script) {
    // A JSON generator's frame that holds no JSON was written by the
    // tool: Letta's parser raises decoding it (its internal-error shape).
    auto raw = lp::b64decode_validate(p.opaque_payload_base64);
    auto utf8 = raw.ok() ? lp::python_utf8_decode_error(*raw) : std::nullopt;
    const std::string exc = utf8 ? "UnicodeDecodeError" : "JSONDecodeError";
    const std::string msg = utf8 ? *utf8 : "the result frame's payload is not JSON";
    r["func_return"] = lp::friendly_error_msg(s.name(), exc, msg);
    r["stdout"] = json::array({p.stdout_text});
    r["stderr"] = json::array({msg});
    out.extra["pickle_error"] = exc + ": " + msg;
    return std::move(out);
  }
  if (f) {
    // pickle.loads (or the server's result["results"]) raised this:
    // Letta's manager reports the exception.
    out.extra["pickle_error"] = f->error->name + ": " + f->error->message;
    r["func_return"] = lp::friendly_error_msg(s.name(), f->error->name, f->error->message);
    r["stderr"].push_back(f->error->name + ": " + f->error->message);
    return std::move(out);
  }
  const std::string why = decoded ? "the pickle payload could not be decoded: " + decoded->failure
                                  : "the result is a pickle payload, which toolsandboxd decodes only in a local sandbox";
  if (decoded) out.extra["pickle_error"] = decoded->failure;
  r["func_return"] = lp::friendly_error_msg(s.name(), "Exception", why);
  return std::move(out);
}

// Script mode: the result in Letta's frame on stdout, read by the parser
// of the script's generation.
Shaped shape_script(Shaping& s, const DecodedPickle* decoded) {
  json& r = s.r();
  Shaped& out = s.out;
  lp::ParsedOutput p = lp::parse_letta_stdout(s.run.stdout_data, s.ctx.generation);
  out.extra["framing"] = std::string(lp::framing_name(p.framing));
  if (p.stdout_invalid_utf8) out.extra["stdout_invalid_utf8"] = true;
  // Letta decodes the stdout around a frame whose md5 matched before it
  // parses the payload: there the decode error comes first.
  if (s.strict_utf8() && p.corrupted && p.frame_verified && p.stdout_decode_error)
    return s.decode_failure(*p.stdout_decode_error);
  if (p.corrupted) {
    // Letta's "internal error" shape (local_sandbox.py:233-251).
    r["func_return"] = lp::friendly_error_msg(s.name(), p.error_name, p.error_message);
    // Letta raises before it has any stdout text: [""]. For scripts of
    // neither generation the output is kept.
    r["stdout"] = json::array({s.strict_utf8() ? std::string() : p.stdout_text});
    r["stderr"] = json::array({p.error_message});
    return std::move(out);
  }
  if (s.strict_utf8() && p.stdout_decode_error) return s.decode_failure(*p.stdout_decode_error);
  if (p.opaque_pickle) return shape_pickle(s, p, decoded);
  r["stdout"] = as_list(p.stdout_text);
  r["stderr"] = as_list(s.run.stderr_data);
  r["status"] = s.success_exit() ? "success" : "error";
  if (p.usable()) {
    r["func_return"] = p.results;
    r["agent_state"] = p.agent_state;
    out.func_return_text = p.results_text;
    if (!p.agent_state.is_null()) out.agent_state_text = p.agent_state_text;
  }
  if (!s.success_exit() && !p.found())
    r["func_return"] = failure_from_stderr(s.name(), s.run.stderr_data, s.fallback_name(), s.fallback_msg());
  return std::move(out);
}

// Tool mode: the runner's frame, from its channel (a local sandbox) or the
// one on stdout carrying this run's nonce (an E2B cell); nothing on stdout
// counts in the first case, nothing but that frame in the second. An
// answer instead when there is no usable frame.
std::variant<lp::NonceFrame, Shaped> runner_frame(Shaping& s, const ChannelOutcome* channel) {
  const ShapeContext& ctx = s.ctx;
  constexpr const char* kUndeclared = "runner result: an agent_state from a function that does not declare agent_state";
  if (!ctx.channel) {
    s.out.extra["framing"] = "nonce";
    auto frame = lp::extract_nonce_frame(s.run.stdout_data, ctx.nonce);
    if (!frame.ok()) return s.corrupted(frame.error().message);
    if (!frame->has_value()) return s.no_result(channel);
    if (!ctx.may_declare && !(*frame)->agent_state.is_null()) return s.corrupted(kUndeclared);
    return std::move(**frame);
  }
  s.out.extra["framing"] = ctx.typescript ? "typescript-json" : "channel";
  if (!channel || !channel->declared || channel->result_total == 0) return s.no_result(channel);
  if (channel->result_total > ctx.result_cap) {
    // As a print of that size would: the run ends in error, here with its
    // output intact.
    s.r()["func_return"] = lp::friendly_error_msg(s.name(), "RuntimeError",
                                                  "the tool's result of " + std::to_string(channel->result_total) +
                                                      " bytes is larger than the policy's limit of " +
                                                      format_size(ctx.result_cap) + " (limits.result)");
    s.r()["stdout"] = as_list(s.run.stdout_data);
    s.r()["stderr"] = as_list(s.run.stderr_data);
    s.out.extra["result_bytes"] = channel->result_total;
    return std::move(s.out);
  }
  auto parsed = lp::parse_channel_result(channel->result, s.run.stdout_data);
  if (!parsed.ok()) return s.corrupted(parsed.error().message);
  if (!*channel->declared && !parsed->agent_state.is_null()) return s.corrupted(kUndeclared);
  return std::move(parsed).value();
}

// Tool mode: what the runner's frame says the tool did.
Shaped shape_runner(Shaping& s, const ChannelOutcome* channel) {
  auto read = runner_frame(s, channel);
  if (Shaped* answered = std::get_if<Shaped>(&read)) return std::move(*answered);
  lp::NonceFrame& f = std::get<lp::NonceFrame>(read);
  json& r = s.r();
  Shaped& out = s.out;
  r["stdout"] = as_list(f.stdout_text);
  r["stderr"] = as_list(s.ctx.typescript ? lp::utf8_decode_replace(s.run.stderr_data).text : s.run.stderr_data);
  if (f.error) {
    out.extra["error_kind"] = f.error->kind;
    // What the tool raised is read from stderr exactly as Letta reads its
    // script's (an exception with an empty or multi-line message, or a class
    // not named ...Error, gives Letta's text); what the runner found itself
    // (a missing function, an argument not in the schema, a dead process)
    // is said as it is.
    r["func_return"] = f.error->raised ? failure_from_stderr(s.name(), s.run.stderr_data, "", "")
                                       : lp::friendly_error_msg(s.name(), f.error->name, f.error->message);
    return std::move(out);
  }
  r["status"] = s.success_exit() ? "success" : "error";
  r["func_return"] = f.results;
  r["agent_state"] = f.agent_state;
  out.func_return_text = std::move(f.results_text);
  if (!f.agent_state.is_null()) out.agent_state_text = std::move(f.agent_state_text);
  return std::move(out);
}

}  // namespace

namespace {

// Tool mode and TypeScript runs: the run with its output as Python's errors="replace" decode
// shows it (the result is on its own channel or frame, which output that is
// not UTF-8 cannot touch); the record says which stream had invalid bytes.
// nullopt when both are valid UTF-8 (no copy).
std::optional<isolate::RunResult> output_decoded_replacing(const isolate::RunResult& run, json& extra) {
  const bool out_ok = lp::is_valid_utf8(run.stdout_data), err_ok = lp::is_valid_utf8(run.stderr_data);
  if (out_ok && err_ok) return std::nullopt;
  isolate::RunResult copy = run;
  if (!out_ok) {
    copy.stdout_data = lp::utf8_decode_replace(run.stdout_data).text;
    extra["stdout_invalid_utf8"] = true;
  }
  if (!err_ok) {
    copy.stderr_data = lp::utf8_decode_replace(run.stderr_data).text;
    extra["stderr_invalid_utf8"] = true;
  }
  return copy;
}

// Script mode, a script of the seed's generator or its legacy-json successor
// (the text markers): its server read the output with subprocess.run(...,
// text=True), which decodes stdout, then stderr, strictly and raises
// UnicodeDecodeError out of the sandbox; ToolExecutionManager reports it.
std::optional<std::string> legacy_decode_error(const ShapeContext& ctx, const isolate::RunResult& run) {
  if (ctx.tool_mode || ctx.generation != lp::ScriptGeneration::kLegacy) return std::nullopt;
  if (auto e = lp::python_utf8_decode_error(run.stdout_data)) return e;
  return lp::python_utf8_decode_error(run.stderr_data);
}

}  // namespace

Shaped shape_tool_result(const ShapeContext& ctx, const isolate::RunResult& run, const DecodedPickle* decoded,
                         const ChannelOutcome* channel) {
  Shaped shaped;
  shaped.result = tool_execution_result(ctx);
  std::optional<isolate::RunResult> replaced;
  if (ctx.tool_mode || ctx.typescript) replaced = output_decoded_replacing(run, shaped.extra);
  Shaping s{ctx, replaced ? *replaced : run, std::move(shaped)};
  if (auto stopped = shape_stopped(s)) return std::move(*stopped);
  if (s.strict_utf8())
    if (auto e = lp::python_utf8_decode_error(run.stderr_data)) return s.decode_failure(*e);
  if (auto e = legacy_decode_error(ctx, run)) {
    Shaped failed = shape_failure(ctx, run, RunFailure{"UnicodeDecodeError", *e});
    failed.extra = std::move(s.out.extra);
    failed.extra["utf8_error"] = *e;
    if (!lp::is_valid_utf8(run.stdout_data)) failed.extra["stdout_invalid_utf8"] = true;
    return failed;
  }
  // (A local TypeScript execute answers on the channel too.)
  return ctx.tool_mode || ctx.channel ? shape_runner(s, channel) : shape_script(s, decoded);
}

std::optional<std::string> pickle_payload_to_decode(const ShapeContext& ctx, const isolate::RunResult& run) {
  // Most runs have no frame marker at all: no shaping for them.
  if (ctx.tool_mode || ctx.channel || ctx.json_result_script ||
      (run.stdout_data.find(lp::kBinaryMarker) == std::string::npos &&
       run.stdout_data.find(lp::kLegacyStartMarker) == std::string::npos))
    return std::nullopt;
  Shaped s = shape_tool_result(ctx, run);
  if (!s.extra.contains("opaque_pickle") || !s.extra.contains("payload_base64")) return std::nullopt;
  return s.extra["payload_base64"].get<std::string>();
}

Shaped shape_failure(const ShapeContext& ctx, const isolate::RunResult& run, const RunFailure& f) {
  // As Letta's manager reports an exception its sandbox raised
  // (ToolExecutionManager, letta/services/tool_executor/tool_execution_manager.py).
  Shaped out;
  out.result = tool_execution_result(ctx);
  out.result["func_return"] = lp::friendly_error_msg(ctx.tool_name, f.exception, f.message);
  out.result["stdout"] = as_list(lp::utf8_decode_replace(run.stdout_data).text);
  json errs = as_list(lp::utf8_decode_replace(run.stderr_data).text);
  errs.push_back(f.exception + ": " + f.message);
  out.result["stderr"] = std::move(errs);
  return out;
}

namespace {

// Where an E2B script's result is: the cell's main result (base64 of the
// JSON payload, as Letta's E2B script returns it) or a frame on stdout.
// Sets `found` and the texts, or the sentence why the result is unusable.
struct CellResult {
  bool found = false;
  json results, agent_state;
  std::string bad;  // the result is there but unusable: why
  std::string bad_exception = "Exception";
};

// Python's type name of a JSON value, as json.loads makes it.
std::string python_type_name(const json& v) {
  if (v.is_array()) return "list";
  if (v.is_string()) return "str";
  if (v.is_boolean()) return "bool";
  if (v.is_null()) return "NoneType";
  if (v.is_number_float()) return "float";
  return "int";
}

// A TypeScript script's main result as Letta's parse_typescript_result
// reads it (letta/services/tool_sandbox/typescript_generator.py): empty
// text -> (None, None); JSON -> its "results" and "agent_state" (a value that
// is not an object has no .get: AttributeError); anything else -> the text
// itself. The text is what E2B's kernel made of the script's last value
// (util.inspect, one pair of quotes stripped by its server): PROTOCOL.md §13.
CellResult typescript_result(const std::string& text, Shaped& out) {
  CellResult c;
  c.found = true;
  if (text.empty()) {
    out.extra["framing"] = "typescript-empty";
    return c;
  }
  // Python's JSON exactly (NaN, integers of any size), through the same
  // parser as a payload of Letta's text framing.
  lp::ParsedOutput exact = lp::parse_letta_stdout(
      std::string(lp::kLegacyStartMarker) + lp::b64encode(text) + std::string(lp::kLegacyEndMarker),
      lp::ScriptGeneration::kLegacy);
  if (exact.usable() && !exact.empty_payload) {
    out.extra["framing"] = "typescript-json";
    c.results = exact.results;
    c.agent_state = exact.agent_state;
    out.func_return_text = exact.results_text;
    if (!c.agent_state.is_null()) out.agent_state_text = exact.agent_state_text;
    return c;
  }
  json v = protocol::parse_json_bounded(text);
  if (!v.is_discarded()) {
    out.extra["framing"] = "typescript-json";
    c.found = false;
    c.bad_exception = "AttributeError";
    c.bad = "'" + python_type_name(v) + "' object has no attribute 'get'";
    out.extra["frame_error"] = c.bad;
    return c;
  }
  out.extra["framing"] = "typescript-text";
  c.results = text;
  return c;
}

CellResult cell_result(const CellOutcome& cell, Shaped& out, json& stdout_list) {
  CellResult c;
  auto take = [&](const lp::ParsedOutput& p) {
    c.found = true;
    c.results = p.results;
    c.agent_state = p.agent_state;
    out.func_return_text = p.results_text;
    if (!c.agent_state.is_null()) out.agent_state_text = p.agent_state_text;
  };
  if (cell.main_result && cell.typescript) return typescript_result(*cell.main_result, out);
  if (cell.main_result) {
    out.extra["framing"] = "e2b-result";
    const std::string& text = *cell.main_result;
    auto raw = lp::b64decode_validate(text);
    // The payload as the text framing carries it (base64 between the
    // markers), read by the same parser, which keeps Python's JSON exactly
    // (NaN, integers of any size, lone surrogates) and wants an object.
    lp::ParsedOutput exact;
    if (raw.ok())
      exact = lp::parse_letta_stdout(std::string(lp::kLegacyStartMarker) + text + std::string(lp::kLegacyEndMarker),
                                     lp::ScriptGeneration::kLegacy);
    if (raw.ok() && exact.usable() && !exact.empty_payload) {
      take(exact);
    } else {
      // Why the parser refused it (as for a frame in stdout below), else why not.
      c.bad = !raw.ok()        ? "the cell's main result is not base64 of a JSON payload"
              : exact.corrupted ? exact.error_message
                                : "the cell's main result is base64, but not of a JSON object";
      out.extra["frame_error"] = c.bad;
    }
    return c;
  }
  std::string all;
  for (const auto& s : cell.out) all += s;
  auto p = lp::parse_letta_stdout(all);
  out.extra["framing"] = std::string(lp::framing_name(p.framing));
  if (p.found()) {
    stdout_list = as_list(p.stdout_text);
    if (p.usable()) {
      take(p);
    } else {
      c.bad = p.corrupted ? p.error_message : "the result frame carries a payload that is not JSON";
      out.extra["frame_error"] = c.bad;
    }
  }
  return c;
}

}  // namespace

Shaped shape_cell(const ShapeContext& ctx, const CellOutcome& cell) {
  // As Letta's E2B sandbox (AsyncToolSandboxE2B.run,
  // letta/services/tool_sandbox/e2b_sandbox.py) reads an execution.
  Shaped out;
  json& r = out.result = tool_execution_result(ctx);
  const std::string& tool = ctx.tool_name;
  json stdout_list = json::array(), stderr_list = json::array();
  for (const auto& s : cell.out) stdout_list.push_back(lp::utf8_decode_replace(s).text);
  for (const auto& s : cell.err) stderr_list.push_back(lp::utf8_decode_replace(s).text);
  const CellResult c = cell_result(cell, out, stdout_list);
  r["stdout"] = stdout_list;
  r["stderr"] = stderr_list;
  if (cell.error && !cell.error->traceback.empty()) r["stderr"].push_back(lp::utf8_decode_replace(cell.error->traceback).text);
  r["status"] = cell.error ? "error" : "success";
  if (c.found) {
    r["func_return"] = c.results;
    r["agent_state"] = c.agent_state;
  } else if (!c.bad.empty()) {
    r["status"] = "error";
    r["func_return"] = lp::friendly_error_msg(tool, c.bad_exception, c.bad);
  } else if (cell.error) {
    r["func_return"] = lp::friendly_error_msg(tool, cell.error->name, cell.error->value);
  } else {
    r["status"] = "error";
    r["func_return"] = lp::friendly_error_msg(tool, "ValueError", "Tool " + tool + " returned execution with None");
  }
  return out;
}

}  // namespace tsb::core
