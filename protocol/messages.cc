#include "protocol/messages.h"

#include "protocol/json_limits.h"

#include <algorithm>
#include <set>
#include <vector>

namespace tsb::protocol {
namespace {

using nlohmann::json;

struct Decoder {
  const json& obj;
  std::string where;
  std::set<std::string> seen;
  std::optional<ProtocolError> err;

  void fail(std::string msg) {
    if (!err) err = ProtocolError{ErrorCode::BadRequest, std::move(msg)};
  }
  const json* get(const char* key, json::value_t t, bool required) {
    seen.insert(key);
    auto it = obj.find(key);
    if (it == obj.end() || (it->is_null() && !required)) {
      if (required) fail(where + ": missing field \"" + key + "\"");
      return nullptr;
    }
    bool ok = it->type() == t || (t == json::value_t::number_float && it->is_number()) ||
              (t == json::value_t::number_unsigned && it->is_number_unsigned());
    if (!ok) {
      fail(where + ": field \"" + key + "\" must be " + type_name(t));
      return nullptr;
    }
    return &*it;
  }
  std::optional<std::string> str(const char* key, bool required, std::size_t max = SIZE_MAX) {
    const json* v = get(key, json::value_t::string, required);
    if (!v) return std::nullopt;
    if (v->get_ref<const std::string&>().size() > max) {
      fail(where + ": field \"" + key + "\" is longer than " + std::to_string(max) + " bytes");
      return std::nullopt;
    }
    return v->get<std::string>();
  }
  void no_unknown() {
    for (auto it = obj.begin(); it != obj.end(); ++it)
      if (!seen.count(it.key())) {
        std::string k = it.key().substr(0, 64);
        fail(where + ": unknown field \"" + k + "\"");
      }
  }
  static const char* type_name(json::value_t t) {
    switch (t) {
      case json::value_t::string: return "a string";
      case json::value_t::object: return "an object";
      case json::value_t::array: return "an array";
      case json::value_t::boolean: return "true or false";
      case json::value_t::number_float: return "a number";
      default: return "of another type";
    }
  }
};

void decode_common(Decoder& d, CommonRunFields& c) {
  auto name = d.str("tool_name", true, 256);
  if (name) {
    if (!is_python_identifier(*name)) d.fail(d.where + ": \"tool_name\" must be a Python identifier");
    c.tool_name = *name;
  }
  if (auto o = d.str("organization_id", true, 256)) c.organization_id = *o;
  c.policy = d.str("policy", false, 128);
  if (const json* env = d.get("env", json::value_t::object, false)) {
    for (auto it = env->begin(); it != env->end(); ++it) {
      if (!it->is_string()) {
        d.fail(d.where + ": env values must be strings (\"" + it.key().substr(0, 64) + "\")");
        continue;
      }
      if (!is_env_name(it.key())) {
        d.fail(d.where + ": env names must match [A-Za-z_][A-Za-z0-9_]* (\"" + it.key().substr(0, 64) + "\")");
        continue;
      }
      if (it->get_ref<const std::string&>().find('\0') != std::string::npos) {
        d.fail(d.where + ": env values must not contain NUL (\"" + it.key().substr(0, 64) + "\")");
        continue;
      }
      c.env[it.key()] = it->get<std::string>();
    }
  }
  if (const json* t = d.get("timeout", json::value_t::number_float, false)) {
    double v = t->get<double>();
    if (!(v > 0 && v <= 86400)) d.fail(d.where + ": \"timeout\" must be seconds in (0, 86400]");
    else c.timeout_s = v;
  }
  if (const json* sc = d.get("sandbox_config", json::value_t::object, false)) {
    Decoder s{*sc, d.where + ".sandbox_config"};
    SandboxConfig cfg;
    if (auto t = s.str("type", true, 64)) cfg.type = *t;
    if (const json* c2 = s.get("config", json::value_t::object, true)) cfg.config = *c2;
    s.no_unknown();
    if (s.err) d.fail(s.err->message);
    c.sandbox_config = std::move(cfg);
  }
  c.agent_id = d.str("agent_id", false, 256);
  c.project_id = d.str("project_id", false, 256);
}

}  // namespace

std::string_view error_code_name(ErrorCode c) {
  switch (c) {
    case ErrorCode::BadRequest: return "bad_request";
    case ErrorCode::TooLarge: return "too_large";
    case ErrorCode::Unauthorized: return "unauthorized";
    case ErrorCode::Busy: return "busy";
    case ErrorCode::PolicyDenied: return "policy_denied";
    case ErrorCode::Timeout: return "timeout";
    case ErrorCode::Unavailable: return "unavailable";
    case ErrorCode::Internal: return "internal";
  }
  return "internal";
}

std::string_view Request::type_name() const {
  switch (body.index()) {
    case 0: return "execute";
    case 1: return "run_tool";
    default: return "status";
  }
}

bool is_env_name(std::string_view s) {
  if (s.empty() || s.size() > 256) return false;
  auto ok_first = [](char c) { return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); };
  if (!ok_first(s[0])) return false;
  return std::all_of(s.begin(), s.end(), [&](char c) { return ok_first(c) || (c >= '0' && c <= '9'); });
}

bool is_python_identifier(std::string_view s) {
  // Keywords cannot name a function (keyword.kwlist of Python 3.11).
  static constexpr std::string_view kKeywords[] = {
      "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue",
      "def", "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import", "in",
      "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while", "with", "yield"};
  for (auto k : kKeywords)
    if (s == k) return false;
  if (s.empty() || s.size() > 256) return false;
  auto ok_first = [](char c) { return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); };
  if (!ok_first(s[0])) return false;
  return std::all_of(s.begin(), s.end(), [&](char c) { return ok_first(c) || (c >= '0' && c <= '9'); });
}

std::variant<Request, ProtocolError> decode_request(std::string_view line, std::string* id_out) {
  // Duplicate keys are refused: with "last one wins" a second "policy" or
  // "env" could hide behind the first for whoever reads the request.
  std::vector<std::set<std::string>> keys;
  bool duplicate = false;
  auto cb = [&](int, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::object_start) keys.emplace_back();
    else if (ev == json::parse_event_t::object_end && !keys.empty()) keys.pop_back();
    else if (ev == json::parse_event_t::key && !keys.empty() && !keys.back().insert(parsed.get<std::string>()).second)
      duplicate = true;
    return true;
  };
  // JSON text never contains a raw NUL; the parser would stop there and
  // ignore whatever follows.
  if (line.find('\0') != std::string_view::npos) return ProtocolError{ErrorCode::BadRequest, "NUL byte in the request line"};
  if (!json_nesting_within(line))
    return ProtocolError{ErrorCode::BadRequest, "JSON nested deeper than " + std::to_string(kMaxJsonNesting) + " levels"};
  json j = json::parse(line.begin(), line.end(), cb, false);
  if (j.is_discarded()) return ProtocolError{ErrorCode::BadRequest, "not a JSON object (invalid JSON or UTF-8)"};
  if (duplicate) return ProtocolError{ErrorCode::BadRequest, "duplicate keys in an object"};
  if (!j.is_object()) return ProtocolError{ErrorCode::BadRequest, "a request must be a JSON object"};
  Decoder d{j, "request"};
  Request req;
  if (auto id = d.str("id", true, kMaxIdLength)) {
    if (id->empty()) d.fail("request: \"id\" must not be empty");
    req.id = *id;
    if (id_out) *id_out = *id;
  }
  if (j.contains("v") && !j["v"].is_number_unsigned())
    return ProtocolError{ErrorCode::BadRequest, "request: field \"v\" must be the integer 1"};
  const json* v = d.get("v", json::value_t::number_unsigned, true);
  if (v && v->get<std::uint64_t>() != kProtocolVersion)
    d.fail("unsupported protocol version " + std::to_string(v->get<std::uint64_t>()) + " (this daemon speaks 1)");
  auto type = d.str("type", true, 32);
  if (d.err) return *d.err;
  if (*type == "execute") {
    ExecuteRequest r;
    decode_common(d, r.common);
    if (auto s = d.str("script", true)) r.script = *s;
    req.body = std::move(r);
  } else if (*type == "run_tool") {
    RunToolRequest r;
    decode_common(d, r.common);
    if (auto s = d.str("source_code", true)) r.source_code = *s;
    if (const json* a = d.get("args", json::value_t::object, false)) r.args = *a;
    else r.args = json::object();
    if (const json* s = d.get("json_schema", json::value_t::object, false)) r.json_schema = *s;
    if (const json* s = d.get("agent_state", json::value_t::object, false)) r.agent_state = *s;
    if (const json* p = d.get("pip_requirements", json::value_t::array, false)) {
      for (const auto& e : *p) {
        if (!e.is_string()) d.fail("request: pip_requirements must be strings");
        else r.pip_requirements.push_back(e.get<std::string>());
      }
    }
    req.body = std::move(r);
  } else if (*type == "status") {
    req.body = StatusRequest{};
  } else {
    return ProtocolError{ErrorCode::BadRequest, "unknown request type \"" + type->substr(0, 32) +
                                                    "\" (execute, run_tool, status)"};
  }
  d.no_unknown();
  if (d.err) return *d.err;
  return req;
}

std::string encode_error(std::string_view id, ErrorCode code, std::string_view message) {
  json j = {{"v", kProtocolVersion},
            {"id", id.empty() ? json() : json(std::string(id))},
            {"ok", false},
            {"error", {{"code", std::string(error_code_name(code))}, {"message", std::string(message)}}}};
  return j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
}

std::string encode_ok(std::string_view id, std::string_view key, const json& payload) {
  json j = {{"v", kProtocolVersion}, {"id", std::string(id)}, {"ok", true}, {std::string(key), payload}};
  return j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
}

}  // namespace tsb::protocol
