#include "protocol/messages.h"

#include <csignal>

#include "protocol/json_limits.h"
#include "protocol/json_scan.h"

#include <algorithm>
#include <charconv>
#include <span>
#include <vector>

namespace tsb::protocol {
namespace {

using nlohmann::json;

// A member's value as the scanner found it: its text and its kind.
struct Slice {
  std::string_view text;
  JsonKind kind;
};

// Every field name a request can hold, for any type, and those of
// sandbox_config. Members outside these lists are unknown whatever the type.
constexpr std::string_view kRequestFields[] = {
    "id",       "v",          "type",       "tool_name",   "organization_id", "policy", "env", "timeout", "sandbox_config",
    "agent_id", "project_id", "script",     "source_code", "args",            "json_schema", "agent_state",
    "pip_requirements", "json_dialect", "e2b", "source_type", "npm_requirements", "command", "session_id", "workspace",
    "signal"};
constexpr std::string_view kSandboxConfigFields[] = {"type", "config", "organization_id"};
constexpr std::string_view kE2BFields[] = {"sandbox_config", "env"};

// The members of one object, filled from scan_json's on_child: one slot per
// known name, and the first other member (for the "unknown field" message).
// Nothing is kept per unknown member, so a line of millions of them costs
// nothing here.
class Members {
 public:
  explicit Members(std::span<const std::string_view> names) : names_(names), slots_(names.size()) {}

  void add(const JsonChild& c) {
    std::string_view name = c.key.size() >= 2 ? c.key.substr(1, c.key.size() - 2) : std::string_view();
    std::string decoded;
    if (name.find('\\') != std::string_view::npos) name = decoded = json_string_value(c.key);
    for (std::size_t i = 0; i < names_.size(); ++i)
      if (names_[i] == name) {
        slots_[i] = Slice{c.value, c.kind};  // the scanner refuses duplicate keys
        return;
      }
    if (!unknown_) unknown_ = Unknown{std::string(name.substr(0, 64)), c.value.data()};
  }

  std::size_t index(std::string_view name) const {
    for (std::size_t i = 0; i < names_.size(); ++i)
      if (names_[i] == name) return i;
    return names_.size();  // a name missing from the lists above: a bug, reported as an absent field
  }
  const Slice* slot(std::size_t i) const { return i < slots_.size() && slots_[i] ? &*slots_[i] : nullptr; }
  std::size_t size() const { return names_.size(); }
  std::string_view name(std::size_t i) const { return names_[i]; }

  // The first member, in document order, that is unknown or known but not
  // read (`read[i]` false): its name, cut to 64 bytes, or nullopt.
  std::optional<std::string> first_unread(const std::vector<bool>& read) const {
    const char* best = unknown_ ? unknown_->at : nullptr;
    std::optional<std::string> name = unknown_ ? std::optional<std::string>(unknown_->name) : std::nullopt;
    for (std::size_t i = 0; i < slots_.size(); ++i)
      if (slots_[i] && !read[i] && (!best || slots_[i]->text.data() < best)) {
        best = slots_[i]->text.data();
        name = std::string(names_[i]);
      }
    return name;
  }

 private:
  struct Unknown {
    std::string name;
    const char* at;  // the value's position in the line, for document order
  };
  std::span<const std::string_view> names_;
  std::vector<std::optional<Slice>> slots_;
  std::optional<Unknown> unknown_;
};

// Scans a value that scan_json already accepted as part of the line, to walk
// its direct children (duplicates were refused the first time).
template <class F>
bool for_each_child(std::string_view text, F&& f) {
  JsonScanOptions o;
  o.duplicate_keys = false;
  o.on_child = std::forward<F>(f);
  return std::holds_alternative<JsonScanned>(scan_json(text, o));
}

std::string shown_number(std::string_view text) {
  return text.size() <= 32 ? std::string(text) : std::string(text.substr(0, 32)) + "...";
}

struct Decoder {
  const Members& obj;
  std::string where;
  std::vector<bool> seen = std::vector<bool>(obj.size());
  std::optional<ProtocolError> err = std::nullopt;

  void fail(std::string msg) {
    if (!err) err = ProtocolError{ErrorCode::BadRequest, std::move(msg)};
  }
  const Slice* get(const char* key, JsonKind want, bool required) {
    std::size_t i = obj.index(key);
    if (i < seen.size()) seen[i] = true;
    const Slice* v = obj.slot(i);
    if (!v || (v->kind == JsonKind::Null && !required)) {
      if (required) fail(where + ": missing field \"" + key + "\"");
      return nullptr;
    }
    if (v->kind != want) {
      fail(where + ": field \"" + key + "\" must be " + kind_name(want));
      return nullptr;
    }
    return v;
  }
  std::optional<std::string> str(const char* key, bool required, std::size_t max = SIZE_MAX) {
    const Slice* v = get(key, JsonKind::String, required);
    if (!v) return std::nullopt;
    std::string s = json_string_value(v->text);
    if (s.size() > max) {
      fail(where + ": field \"" + key + "\" is longer than " + std::to_string(max) + " bytes");
      return std::nullopt;
    }
    return s;
  }
  void no_unknown() {
    if (auto k = obj.first_unread(seen)) fail(where + ": unknown field \"" + *k + "\"");
  }
  static const char* kind_name(JsonKind k) {
    switch (k) {
      case JsonKind::String: return "a string";
      case JsonKind::Object: return "an object";
      case JsonKind::Array: return "an array";
      case JsonKind::Boolean: return "true or false";
      case JsonKind::Number: return "a number";
      default: return "of another type";
    }
  }
};

void decode_env(Decoder& d, const Slice& env, std::map<std::string, std::string>& out) {
  std::size_t count = 0;
  bool failed = false;
  for_each_child(env.text, [&](const JsonChild& c) {
    if (failed) return;
    if (++count > kMaxEnvVariables) {
      d.fail(d.where + ": env holds more than " + std::to_string(kMaxEnvVariables) + " variables");
      failed = true;
      return;
    }
    std::string name = json_string_value(c.key);
    if (c.kind != JsonKind::String) {
      d.fail(d.where + ": env values must be strings (\"" + name.substr(0, 64) + "\")");
    } else if (!is_env_name(name)) {
      d.fail(d.where + ": env names must match [A-Za-z_][A-Za-z0-9_]* (\"" + name.substr(0, 64) + "\")");
    } else {
      std::string value = json_string_value(c.value);
      if (value.find('\0') != std::string::npos) {
        d.fail(d.where + ": env values must not contain NUL (\"" + name.substr(0, 64) + "\")");
      } else {
        out[std::move(name)] = std::move(value);
        return;
      }
    }
    failed = true;  // only the first problem is reported
  });
}

// A Letta sandbox config feeds the fingerprint, so it becomes a document; it
// is small (Letta's configs are a few fields), and bounded here.
void decode_sandbox_config(Decoder& d, const Slice& sc, std::optional<SandboxConfig>& out) {
  if (sc.text.size() > kMaxSandboxConfigBytes) {
    d.fail(d.where + ": field \"sandbox_config\" is larger than " + std::to_string(kMaxSandboxConfigBytes) + " bytes");
    return;
  }
  Members members(kSandboxConfigFields);
  // The fingerprint is computed from numbers as Python holds them; a number
  // a double or a 64-bit integer cannot hold would change on the way, so it
  // is refused rather than rounded.
  bool out_of_range = false;
  JsonScanOptions o;
  o.duplicate_keys = false;
  o.on_child = [&](const JsonChild& c) { members.add(c); };
  o.on_number = [&](std::string_view n) {
    if (json_number_is_integer(n) && !json_integer_fits_64_bits(n)) out_of_range = true;
  };
  if (!std::holds_alternative<JsonScanned>(scan_json(sc.text, o))) {
    d.fail(d.where + ": field \"sandbox_config\" could not be read");
    return;
  }
  Decoder s{members, d.where + ".sandbox_config"};
  SandboxConfig cfg;
  if (auto t = s.str("type", true, 64)) cfg.type = *t;
  cfg.organization_id = s.str("organization_id", false, 256);
  const Slice* org = members.slot(members.index("organization_id"));
  cfg.organization_null = org && org->kind == JsonKind::Null;
  if (const Slice* c2 = s.get("config", JsonKind::Object, true)) {
    // Scanned above as part of sandbox_config (size, depth); equal keys
    // keep the last, as Python's dict does.
    JsonLimits lim;
    lim.max_bytes = kMaxSandboxConfigBytes;
    lim.duplicate_keys = false;
    auto config = parse_json_limited(c2->text, lim);
    // nlohmann refuses numbers beyond a double's range (it keeps the rest).
    if (out_of_range || (!config.ok() && config.error().code == ERANGE))
      s.fail(s.where + ": a number in \"config\" is out of range (integers must fit in 64 bits, other numbers in a double)");
    else if (!config.ok())
      s.fail(s.where + ": \"config\": " + config.error().message);
    else
      cfg.config = std::move(*config);
  }
  s.no_unknown();
  if (s.err) d.fail(s.err->message);
  out = std::move(cfg);
}

// "e2b": the sandbox_config and env a run delegated to E2B uses, decoded
// with the same rules as the request's own.
void decode_e2b(Decoder& d, const Slice& e, std::optional<E2BAlternative>& out) {
  Members members(kE2BFields);
  if (!for_each_child(e.text, [&](const JsonChild& c) { members.add(c); })) {
    d.fail(d.where + ": field \"e2b\" could not be read");
    return;
  }
  Decoder s{members, d.where + ".e2b"};
  E2BAlternative alt;
  if (const Slice* sc = s.get("sandbox_config", JsonKind::Object, false)) decode_sandbox_config(s, *sc, alt.sandbox_config);
  if (const Slice* env = s.get("env", JsonKind::Object, false)) decode_env(s, *env, alt.env.emplace());
  s.no_unknown();
  if (s.err) d.fail(s.err->message);
  out = std::move(alt);
}

// pip_requirements or npm_requirements: an array of at most `max` strings.
void decode_requirements(Decoder& d, const Slice& p, const char* field, std::size_t max, std::vector<std::string>& out) {
  bool failed = false;
  for_each_child(p.text, [&](const JsonChild& e) {
    if (failed) return;
    if (out.size() >= max) {
      d.fail(d.where + ": " + field + " holds more than " + std::to_string(max) + " requirements");
      failed = true;
    } else if (e.kind != JsonKind::String) {
      d.fail(d.where + ": " + field + " must be strings");
      failed = true;
    } else {
      out.push_back(json_string_value(e.value));
    }
  });
}

// A session's command: 1-256 strings, none empty or with a NUL, at most
// 64 KiB together.
void decode_command(Decoder& d, const Slice& p, std::vector<std::string>& out) {
  bool failed = false;
  std::size_t total = 0;
  for_each_child(p.text, [&](const JsonChild& e) {
    if (failed) return;
    std::string v = e.kind == JsonKind::String ? json_string_value(e.value) : std::string();
    total += v.size() + 1;
    if (out.size() >= kMaxCommandArgs || total > kMaxCommandBytes) {
      d.fail(d.where + ": \"command\" holds more than " + std::to_string(kMaxCommandArgs) + " arguments or " +
             std::to_string(kMaxCommandBytes) + " bytes");
      failed = true;
    } else if (e.kind != JsonKind::String || (out.empty() && v.empty()) || v.find('\0') != std::string::npos) {
      d.fail(d.where + ": \"command\" must be strings without NUL bytes, the first not empty");
      failed = true;
    } else {
      out.push_back(std::move(v));
    }
  });
  if (!failed && out.empty()) d.fail(d.where + ": \"command\" must name a program");
}

void decode_common(Decoder& d, CommonRunFields& c) {
  auto name = d.str("tool_name", true, 256);
  if (name) {
    if (!is_python_identifier(*name)) d.fail(d.where + ": \"tool_name\" must be a Python identifier");
    c.tool_name = *name;
  }
  if (auto o = d.str("organization_id", true, 256)) c.organization_id = *o;
  c.policy = d.str("policy", false, 128);
  if (const Slice* env = d.get("env", JsonKind::Object, false)) decode_env(d, *env, c.env);
  if (const Slice* t = d.get("timeout", JsonKind::Number, false)) {
    // Read as the nearest double; a number beyond a double's range, either
    // way, is refused rather than turned into infinity or zero.
    double v = 0;
    auto [end, ec] = std::from_chars(t->text.data(), t->text.data() + t->text.size(), v);
    if (ec != std::errc() || end != t->text.data() + t->text.size() || !(v > 0 && v <= 86400))
      d.fail(d.where + ": \"timeout\" must be seconds in (0, 86400]");
    else
      c.timeout_s = v;
  }
  if (const Slice* sc = d.get("sandbox_config", JsonKind::Object, false)) decode_sandbox_config(d, *sc, c.sandbox_config);
  if (const Slice* e = d.get("e2b", JsonKind::Object, false)) decode_e2b(d, *e, c.e2b);
  c.agent_id = d.str("agent_id", false, 256);
  c.project_id = d.str("project_id", false, 256);
  if (auto dialect = d.str("json_dialect", false, 16)) {
    if (*dialect == "python")
      c.python_json = true;
    else if (*dialect != "strict")
      d.fail(d.where + ": \"json_dialect\" must be \"strict\" or \"python\"");
  }
  if (auto lang = d.str("source_type", false, 16)) {
    if (*lang == "typescript")
      c.source_type = SourceType::TypeScript;
    else if (*lang != "python")
      d.fail(d.where + ": \"source_type\" must be \"python\" or \"typescript\"");
  }
  if (const Slice* p = d.get("npm_requirements", JsonKind::Array, false))
    decode_requirements(d, *p, "npm_requirements", kMaxNpmRequirements, c.npm_requirements);
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

const SessionSignal kSessionSignals[7] = {{"HUP", SIGHUP},   {"INT", SIGINT},   {"QUIT", SIGQUIT}, {"USR1", SIGUSR1},
                                          {"USR2", SIGUSR2}, {"TERM", SIGTERM}, {"WINCH", SIGWINCH}};

std::string_view session_signal_name(int number) {
  for (const SessionSignal& k : kSessionSignals)
    if (k.number == number) return k.name;
  return "";
}

std::string_view Request::type_name() const {
  switch (body.index()) {
    case 0: return "execute";
    case 1: return "run_tool";
    case 2: return "status";
    case 3: return "session";
    case 4: return "session_list";
    default: return "session_kill";
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
  // JSON text never contains a raw NUL (the scanner refuses one too; this
  // gives it its own message).
  if (line.find('\0') != std::string_view::npos) return ProtocolError{ErrorCode::BadRequest, "NUL byte in the request line"};
  const std::string too_deep = "JSON nested deeper than " + std::to_string(kMaxJsonNesting) + " levels";
  Members top(kRequestFields);
  JsonScanOptions scan;
  scan.allow_bom = true;  // as nlohmann::json did; RFC 8259 section 8.1 allows ignoring one
  scan.on_child = [&](const JsonChild& c) { top.add(c); };
  auto scanned = scan_json(line, scan);
  if (const auto* e = std::get_if<JsonScanError>(&scanned)) {
    switch (e->failure) {
      case JsonScanFailure::TooDeep:
        return ProtocolError{ErrorCode::BadRequest, too_deep};
      case JsonScanFailure::DuplicateKey:
        // With "last one wins" a second "policy" or "env" could hide
        // behind the first for whoever reads the request.
        return ProtocolError{ErrorCode::BadRequest, "duplicate keys in an object (at byte " + std::to_string(e->offset) + ")"};
      case JsonScanFailure::Syntax:
        // A line too deep is called so even when it is also malformed
        // further on.
        if (!json_nesting_within(line)) return ProtocolError{ErrorCode::BadRequest, too_deep};
        return ProtocolError{ErrorCode::BadRequest, "not a JSON object (invalid JSON or UTF-8): " + std::string(e->what) +
                                                        " at byte " + std::to_string(e->offset)};
    }
  }
  if (std::get<JsonScanned>(scanned).kind != JsonKind::Object)
    return ProtocolError{ErrorCode::BadRequest, "a request must be a JSON object"};

  Decoder d{top, "request"};
  Request req;
  if (auto id = d.str("id", true, kMaxIdLength)) {
    if (id->empty()) d.fail("request: \"id\" must not be empty");
    req.id = *id;
    if (id_out) *id_out = *id;
  }
  // Only the JSON integer 1: not 1.0, 1e0, -1, "1"; a version of any length
  // is compared as written, never converted.
  const Slice* vs = top.slot(top.index("v"));
  if (vs && (vs->kind != JsonKind::Number || !json_number_is_integer(vs->text) || vs->text[0] == '-'))
    return ProtocolError{ErrorCode::BadRequest, "request: field \"v\" must be the integer 1"};
  const Slice* v = d.get("v", JsonKind::Number, true);
  if (v && v->text != "1")
    d.fail("unsupported protocol version " + shown_number(v->text) + " (this daemon speaks " + std::to_string(kProtocolVersion) + ")");
  auto type = d.str("type", true, 32);
  if (d.err) return *d.err;
  if (*type == "execute") {
    ExecuteRequest r;
    decode_common(d, r.common);
    if (auto s = d.str("script", true)) r.script = std::move(*s);
    req.body = std::move(r);
  } else if (*type == "run_tool") {
    RunToolRequest r;
    decode_common(d, r.common);
    if (auto s = d.str("source_code", true)) r.source_code = std::move(*s);
    // Forwarded as text: validated with the whole line, copied as sent.
    if (const Slice* a = d.get("args", JsonKind::Object, false)) r.args.assign(a->text);
    if (const Slice* s = d.get("json_schema", JsonKind::Object, false)) r.json_schema.assign(s->text);
    if (const Slice* s = d.get("agent_state", JsonKind::Object, false)) r.agent_state.assign(s->text);
    if (const Slice* p = d.get("pip_requirements", JsonKind::Array, false))
      decode_requirements(d, *p, "pip_requirements", kMaxPipRequirements, r.pip_requirements);
    // Letta gives a TypeScript tool no agent_state (its generator has none).
    if (r.common.source_type == SourceType::TypeScript && r.agent_state != "null")
      d.fail(d.where + ": a TypeScript tool takes no \"agent_state\" (send null or leave it out)");
    req.body = std::move(r);
  } else if (*type == "status") {
    req.body = StatusRequest{};
  } else if (*type == "session") {
    SessionRequest r;
    if (auto o = d.str("organization_id", true, 256)) r.organization_id = *o;
    r.policy = d.str("policy", false, 128);
    if (const Slice* c = d.get("command", JsonKind::Array, true)) decode_command(d, *c, r.command);
    if (const Slice* env = d.get("env", JsonKind::Object, false)) decode_env(d, *env, r.env);
    r.agent_id = d.str("agent_id", false, 256);
    r.workspace = d.str("workspace", false, 128);
    if (r.workspace && (r.workspace->empty() || r.workspace->find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-") != std::string::npos))
      d.fail(d.where + ": field \"workspace\" must be 1 to 128 of A-Z a-z 0-9 . _ : -");
    req.body = std::move(r);
  } else if (*type == "session_list") {
    req.body = SessionListRequest{};
  } else if (*type == "session_kill") {
    SessionKillRequest r;
    if (auto sid = d.str("session_id", true, 64)) r.session_id = *sid;
    if (auto sig = d.str("signal", false, 16)) {
      for (const SessionSignal& k : kSessionSignals)
        if (*sig == k.name) r.signal = k.number;
      if (!r.signal) d.fail(d.where + ": field \"signal\" must be one of HUP, INT, QUIT, USR1, USR2, TERM, WINCH");
    }
    req.body = std::move(r);
  } else {
    return ProtocolError{ErrorCode::BadRequest, "unknown request type \"" + type->substr(0, 32) +
                                                    "\" (execute, run_tool, status, session, session_list, session_kill)"};
  }
  d.no_unknown();
  if (d.err) return *d.err;
  return req;
}

std::string session_frame(char kind, std::string_view payload) {
  const auto n = static_cast<std::uint32_t>(payload.size());
  std::string f{kind, static_cast<char>(n >> 24), static_cast<char>(n >> 16), static_cast<char>(n >> 8),
                static_cast<char>(n)};
  f.append(payload);
  return f;
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

namespace {

// An object's text with its members in nlohmann's order (sorted keys), the
// members of `raw` written as the given text.
std::string dump_object_with(const json& obj, const std::map<std::string, std::string>& raw) {
  std::map<std::string, std::string> members;
  for (auto it = obj.begin(); it != obj.end(); ++it)
    if (!raw.contains(it.key())) members[it.key()] = it.value().dump(-1, ' ', false, json::error_handler_t::replace);
  std::string out = "{";
  auto add = [&](const std::string& k, const std::string& v) {
    if (out.size() > 1) out += ',';
    out += json(k).dump(-1, ' ', false, json::error_handler_t::replace);
    out += ':';
    out += v;
  };
  auto m = members.begin();
  auto r = raw.begin();
  while (m != members.end() || r != raw.end()) {
    if (r == raw.end() || (m != members.end() && m->first < r->first)) {
      add(m->first, m->second);
      ++m;
    } else {
      // Without the whitespace between its tokens: a line break in it
      // would end the response line.
      add(r->first, json_without_whitespace(r->second));
      ++r;
    }
  }
  out += '}';
  return out;
}

}  // namespace

std::string encode_ok(std::string_view id, std::string_view key, const json& payload,
                      const std::map<std::string, std::string>& raw_members) {
  if (raw_members.empty()) return encode_ok(id, key, payload);
  json envelope = {{"v", kProtocolVersion}, {"id", std::string(id)}, {"ok", true}};
  return dump_object_with(envelope, {{std::string(key), dump_object_with(payload, raw_members)}}) + "\n";
}

}  // namespace tsb::protocol
