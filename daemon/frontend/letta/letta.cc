#include "daemon/frontend/letta/letta.h"
#include "protocol/json_limits.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "daemon/common/hash.h"
#include "protocol/json_scan.h"
#include "daemon/frontend/letta/pyjson.h"

namespace tsb::letta {

// The wire protocol's bounded JSON readers (protocol/json_scan.h,
// protocol/json_limits.h), which Letta's texts go through.
using protocol::json_nesting_within;
using protocol::json_string_value;
using protocol::JsonChild;
using protocol::JsonKind;
using protocol::JsonScanned;
using protocol::JsonScanOptions;
using protocol::parse_json_bounded;
using protocol::scan_json;
namespace {

constexpr std::size_t npos = std::string_view::npos;

// ---------------------------------------------------------------------------
// Payload decoding shared by both Letta framings
// ---------------------------------------------------------------------------

std::optional<unsigned> hex4(std::string_view s) {
  if (s.size() < 4) return std::nullopt;
  unsigned v = 0;
  for (int i = 0; i < 4; ++i) {
    const char c = s[static_cast<std::size_t>(i)];
    v <<= 4;
    if (c >= '0' && c <= '9') v |= static_cast<unsigned>(c - '0');
    else if (c >= 'a' && c <= 'f') v |= static_cast<unsigned>(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F') v |= static_cast<unsigned>(c - 'A' + 10);
    else return std::nullopt;
  }
  return v;
}

// Python's json.loads accepts two things nlohmann rejects and json.dumps
// emits: the constants NaN, Infinity and -Infinity (for non-finite floats),
// and lone surrogate escapes such as "\ud800" (a str may hold them). Rewrite
// the constants to null and lone surrogates to U+FFFD so a payload Letta
// would decode still decodes here. Returns nullopt when nothing needed
// rewriting (the text is then simply not JSON).
std::optional<std::string> rewrite_python_json_extensions(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  bool changed = false;
  bool in_string = false;
  std::size_t i = 0;
  while (i < s.size()) {
    const char c = s[i];
    if (in_string) {
      if (c == '"') {
        in_string = false;
      } else if (c == '\\' && i + 1 < s.size()) {
        if (s[i + 1] == 'u') {
          const auto u = hex4(s.substr(i + 2));
          if (u && *u >= 0xD800 && *u <= 0xDFFF) {
            if (*u <= 0xDBFF && s.substr(i + 6, 2) == "\\u") {
              const auto lo = hex4(s.substr(i + 8));
              if (lo && *lo >= 0xDC00 && *lo <= 0xDFFF) {  // a proper pair: keep it
                out.append(s.substr(i, 12));
                i += 12;
                continue;
              }
            }
            out += "\\ufffd";
            changed = true;
            i += 6;
            continue;
          }
        }
        out.append(s.substr(i, 2));  // any other escape, including \" and \\ .
        i += 2;
        continue;
      }
      out += c;
      ++i;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else {
      const std::string_view rest = s.substr(i);
      std::size_t token = 0;
      if (rest.starts_with("NaN")) token = 3;
      else if (rest.starts_with("Infinity")) token = 8;
      else if (rest.starts_with("-Infinity")) token = 9;
      if (token != 0) {
        out += "null";
        changed = true;
        i += token;
        continue;
      }
    }
    out += c;
    ++i;
  }
  if (!changed) return std::nullopt;
  return out;
}

std::string_view python_type_name(const nlohmann::json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null: return "NoneType";
    case nlohmann::json::value_t::boolean: return "bool";
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned: return "int";
    case nlohmann::json::value_t::number_float: return "float";
    case nlohmann::json::value_t::string: return "str";
    case nlohmann::json::value_t::array: return "list";
    case nlohmann::json::value_t::object: return "dict";
    default: return "object";
  }
}

// Python truthiness of a JSON value.
bool python_truthy(const nlohmann::json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null: return false;
    case nlohmann::json::value_t::boolean: return j.get<bool>();
    case nlohmann::json::value_t::number_integer: return j.get<std::int64_t>() != 0;
    case nlohmann::json::value_t::number_unsigned: return j.get<std::uint64_t>() != 0;
    case nlohmann::json::value_t::number_float: return j.get<double>() != 0.0;  // NaN is truthy, as in Python
    // nlohmann's empty() is false for every string, so look at the text.
    case nlohmann::json::value_t::string: return !j.get_ref<const std::string&>().empty();
    case nlohmann::json::value_t::array:
    case nlohmann::json::value_t::object: return !j.empty();
    default: return true;
  }
}

// The exact text of the "results" and "agent_state" members of a JSON object
// as Python wrote it (NaN, Infinity, lone surrogate escapes, numbers of any
// size), found as Python's json.loads finds them: keys compared once
// unescaped, the last of equal keys wins. Empty views when absent or when
// the text does not scan.
struct PayloadText {
  std::string_view results;
  std::string_view agent_state;
  JsonKind agent_state_kind = JsonKind::Null;
};
PayloadText payload_text(std::string_view text) {
  PayloadText t;
  JsonScanOptions o;
  o.python_values = true;
  o.duplicate_keys = false;
  o.on_child = [&](const JsonChild& c) {
    if (c.key.empty()) return;
    const std::string k = json_string_value(c.key);
    if (k == "results") {
      t.results = c.value;
    } else if (k == "agent_state") {
      t.agent_state = c.value;
      t.agent_state_kind = c.kind;
    }
  };
  auto scanned = scan_json(text, o);
  if (!std::holds_alternative<JsonScanned>(scanned) || std::get<JsonScanned>(scanned).kind != JsonKind::Object)
    return {};
  return t;
}

void set_corrupted(ParsedOutput& r, std::string_view name, std::string_view message) {
  r.corrupted = true;
  r.error_name.assign(name);
  r.error_message.assign(message);
}

// The JSON half of Letta's parse_stdout_best_effort: json.loads(text), then
// result.get("results") and AgentState.model_validate(agent_state) when the
// agent_state is truthy. `raw` is what is reported when text is not JSON.
void decode_json_payload(std::string_view text, std::string_view raw, ParsedOutput& r) {
  // Python's json.loads gives up near its recursion limit too; here the
  // bound also keeps a hostile payload from overflowing the daemon's stack.
  if (!json_nesting_within(text)) {
    r.corrupted = true;
    r.error_name = "RecursionError";
    r.error_message = "maximum recursion depth exceeded while decoding a JSON object from a unicode string";
    return;
  }
  nlohmann::json j = parse_json_bounded(text);
  if (j.is_discarded()) {
    if (auto rewritten = rewrite_python_json_extensions(text)) {
      j = parse_json_bounded(*rewritten);
      if (!j.is_discarded()) r.payload_lossy = true;
    }
  }
  if (j.is_discarded()) {
    r.opaque_pickle = true;
    r.opaque_payload_base64 = b64encode(raw);
    return;
  }
  if (!j.is_object()) {
    // Letta calls result.get(...) and gets an AttributeError.
    set_corrupted(r, "AttributeError", "'" + std::string(python_type_name(j)) + "' object has no attribute 'get'");
    return;
  }
  const PayloadText exact = payload_text(text);
  if (auto it = j.find("results"); it != j.end()) {
    r.results = std::move(*it);
    r.results_text.assign(exact.results);
  }
  if (auto it = j.find("agent_state"); it != j.end() && python_truthy(*it)) {
    if (!it->is_object()) {
      set_corrupted(r, "ValidationError", "agent_state is a " + std::string(python_type_name(*it)) +
                                              ", not an object");
      return;
    }
    r.agent_state = std::move(*it);
    if (exact.agent_state_kind == JsonKind::Object) r.agent_state_text.assign(exact.agent_state);
  }
}

void set_stdout(ParsedOutput& r, std::string_view bytes) {
  auto u = utf8_decode_replace(bytes);
  r.stdout_text = std::move(u.text);
  r.stdout_invalid_utf8 = u.had_invalid;
  if (u.had_invalid) r.stdout_decode_error = python_utf8_decode_error(bytes);
}

// local_sandbox.py parse_out_function_results_markers, on bytes.
void parse_binary_frame(std::string_view out, std::size_t pos, ParsedOutput& r) {
  r.framing = Framing::kBinary;
  const std::size_t len_start = pos + kBinaryMarker.size();
  if (out.size() < len_start + 4) {
    // struct.unpack(">I", <fewer than 4 bytes>) raises struct.error.
    set_corrupted(r, "error", "unpack requires a buffer of 4 bytes");
    set_stdout(r, out);
    return;
  }
  const auto* p = reinterpret_cast<const unsigned char*>(out.data() + len_start);
  const std::uint64_t len = (std::uint64_t{p[0]} << 24) | (std::uint64_t{p[1]} << 16) |
                            (std::uint64_t{p[2]} << 8) | std::uint64_t{p[3]};
  // Python slices clamp at the end of the data; so do substr() with clamped
  // starts. A length that runs past the end therefore checks the md5 of the
  // bytes that are there, exactly as Letta does.
  const std::size_t cs_start = std::min(out.size(), len_start + 4);
  const std::size_t msg_start = std::min(out.size(), cs_start + 32);
  const std::string_view checksum = out.substr(cs_start, 32);
  const std::string_view message = out.substr(msg_start, static_cast<std::size_t>(len));
  if (md5_hex(message) != checksum) {
    set_corrupted(r, "Exception", kCorruptedOutputMessage);
    set_stdout(r, out);
    return;
  }
  r.frame_verified = true;
  std::string remainder(out.substr(0, pos));
  const std::uint64_t after = std::uint64_t{cs_start} + 32 + len;
  if (after < out.size()) remainder.append(out.substr(static_cast<std::size_t>(after)));
  set_stdout(r, remainder);

  if (message.empty()) {  // parse_stdout_best_effort: "if not text: return None, None"
    r.empty_payload = true;
    return;
  }
  // Bytes payload: text.decode("utf-8") (strict), then json.loads. A payload
  // that is not UTF-8 is the pickle of a pre-#3343 script.
  if (!is_valid_utf8(message)) {
    r.opaque_pickle = true;
    r.opaque_payload_base64 = b64encode(message);
    return;
  }
  decode_json_payload(message, message, r);
}

// tool_execution_sandbox.py parse_out_function_results_markers: both markers
// are located with text.index() from the start of the text.
void parse_legacy_frame(std::string_view out, std::size_t start_pos, ParsedOutput& r) {
  r.framing = Framing::kLegacyText;
  const std::size_t end_pos = out.find(kLegacyEndMarker);
  if (end_pos == npos) {
    set_corrupted(r, "ValueError", "substring not found");  // text.index(END) raises
    set_stdout(r, out);
    return;
  }
  const std::size_t payload_start = start_pos + kLegacyStartMarker.size();
  // text[start:end] is empty when end <= start (END before START).
  const std::string_view payload =
      end_pos > payload_start ? out.substr(payload_start, end_pos - payload_start) : std::string_view{};
  r.legacy_end_before_start = end_pos < start_pos;
  // Letta slices the tail with the START marker's length; both are 36.
  std::string remainder(out.substr(0, start_pos));
  remainder.append(out.substr(end_pos + kLegacyStartMarker.size()));
  set_stdout(r, remainder);

  if (payload.empty()) {
    r.empty_payload = true;
    return;
  }
  // str payload: base64.b64decode(validate=True).decode("utf-8") inside one
  // try; on any failure the text itself goes to json.loads.
  auto decoded = b64decode_validate(payload);
  if (decoded.ok() && is_valid_utf8(*decoded)) {
    decode_json_payload(*decoded, *decoded, r);
  } else {
    decode_json_payload(payload, decoded.ok() ? std::string_view(*decoded) : payload, r);
  }
}

// ---------------------------------------------------------------------------
// parse_stderr_error_msg
// ---------------------------------------------------------------------------

bool in_word_table(char32_t cp);

// re.search(r"(\w+(?:Error|Exception)): (.+)$", line) for a line without "\n".
//
// Group 1 is made of word characters and must be followed by ':', which is
// not one, so it always ends where a maximal run of word characters ends.
// Every start inside one run therefore shares that end; the leftmost start
// (the run's first character) gives the longest candidate, and if it fails
// every later start in the run fails too. So the leftmost match is found by
// testing each maximal run in order: it ends in "Error" or "Exception" with at
// least one character before the suffix, is followed by ": ", and at least
// one character follows (".+" needs one; "." matches anything but "\n").
std::optional<std::pair<std::string, std::string>> search_error_pattern(std::string_view line) {
  std::size_t pos = 0;
  while (pos < line.size()) {
    std::size_t next = pos;
    if (!python_re_word_char(utf8_next(line, next))) {
      pos = next;
      continue;
    }
    const std::size_t run_start = pos;
    std::size_t run_end = next;
    while (run_end < line.size()) {
      std::size_t after = run_end;
      if (!python_re_word_char(utf8_next(line, after))) break;
      run_end = after;
    }
    const std::string_view run = line.substr(run_start, run_end - run_start);
    // The suffixes are ASCII, so "more bytes than the suffix" means at least
    // one more character.
    const bool suffix_ok = (run.size() > 5 && run.ends_with("Error")) ||
                           (run.size() > 9 && run.ends_with("Exception"));
    if (suffix_ok && line.substr(run_end, 2) == ": " && run_end + 2 < line.size()) {
      return std::make_pair(std::string(run), std::string(line.substr(run_end + 2)));
    }
    pos = run_end;
  }
  return std::nullopt;
}

// ---------------------------------------------------------------------------
// Nonce frame
// ---------------------------------------------------------------------------

Error bad_frame(std::string_view what) { return Error::invalid("runner result frame: " + std::string(what), EBADMSG); }

std::optional<std::string> get_string(const nlohmann::json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || !it->is_string()) return std::nullopt;
  return it->get<std::string>();
}

}  // namespace

// ---------------------------------------------------------------------------
// Fingerprint
// ---------------------------------------------------------------------------

std::string big_endian_to_decimal(std::string_view bytes) {
  // Base 2^32 limbs, most significant first; repeated division by 10^9
  // yields base-10^9 chunks, least significant first.
  std::vector<std::uint32_t> limbs((bytes.size() + 3) / 4, 0);
  const std::size_t pad = limbs.size() * 4 - bytes.size();
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    const std::size_t k = i + pad;
    limbs[k / 4] |= std::uint32_t{static_cast<unsigned char>(bytes[i])} << (8 * (3 - k % 4));
  }
  constexpr std::uint32_t kChunk = 1000000000;
  std::vector<std::uint32_t> chunks;
  std::size_t first = 0;
  while (true) {
    while (first < limbs.size() && limbs[first] == 0) ++first;
    if (first == limbs.size()) break;
    std::uint64_t rem = 0;
    for (std::size_t i = first; i < limbs.size(); ++i) {
      const std::uint64_t cur = (rem << 32) | limbs[i];
      limbs[i] = static_cast<std::uint32_t>(cur / kChunk);
      rem = cur % kChunk;
    }
    chunks.push_back(static_cast<std::uint32_t>(rem));
  }
  if (chunks.empty()) return "0";
  std::string out = std::to_string(chunks.back());
  for (std::size_t i = chunks.size() - 1; i-- > 0;) {
    const std::string part = std::to_string(chunks[i]);
    out.append(9 - part.size(), '0');
    out += part;
  }
  return out;
}

Result<std::string> sandbox_config_fingerprint(std::string_view type, std::optional<std::string_view> organization_id,
                                               const nlohmann::json& config) {
  nlohmann::json doc = nlohmann::json::object();
  doc["type"] = std::string(type);
  doc["organization_id"] = organization_id ? nlohmann::json(std::string(*organization_id)) : nlohmann::json();
  doc["config"] = config;
  auto text = dumps_compact_sorted(doc);
  if (!text.ok()) return std::move(text).error().wrap("sandbox config fingerprint");
  return big_endian_to_decimal(sha256_raw(*text));
}

// ---------------------------------------------------------------------------
// Letta framings
// ---------------------------------------------------------------------------

std::string_view framing_name(Framing f) {
  switch (f) {
    case Framing::kNone: return "none";
    case Framing::kLegacyText: return "legacy-text";
    case Framing::kBinary: return "binary";
  }
  return "unknown";
}

std::optional<std::string> python_utf8_decode_error(std::string_view s) {
  // CPython's strict UTF-8 decoder (Objects/stringlib/codecs.h): the first
  // invalid sequence raises; its range is the bytes of it that were valid
  // so far (all that is left, when the data ends inside a sequence).
  const auto err = [&](std::size_t start, std::size_t end, const char* reason) {
    char head[96];
    if (end - start == 1)
      std::snprintf(head, sizeof head, "'utf-8' codec can't decode byte 0x%02x in position %zu: ",
                    static_cast<unsigned>(static_cast<unsigned char>(s[start])), start);
    else
      std::snprintf(head, sizeof head, "'utf-8' codec can't decode bytes in position %zu-%zu: ", start, end - 1);
    return std::optional<std::string>(std::string(head) + reason);
  };
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    if (c < 0xC2 || c > 0xF4) return err(i, i + 1, "invalid start byte");
    const std::size_t need = c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    for (std::size_t k = 1; k < need; ++k) {
      if (i + k >= s.size()) return err(i, s.size(), "unexpected end of data");
      const auto b = static_cast<unsigned char>(s[i + k]);
      unsigned lo = 0x80, hi = 0xBF;
      if (k == 1 && c == 0xE0) lo = 0xA0;
      if (k == 1 && c == 0xED) hi = 0x9F;
      if (k == 1 && c == 0xF0) lo = 0x90;
      if (k == 1 && c == 0xF4) hi = 0x8F;
      if (b < lo || b > hi) return err(i, i + k, "invalid continuation byte");
    }
    i += need;
  }
  return std::nullopt;
}

ScriptGeneration detect_script_generation(std::string_view script) {
  // repr() of the marker's bytes, as the current generator writes it.
  constexpr std::string_view kCurrentLiteral = R"(b'\x92\xc8\xe4\x98C\xd3_\xb3\x91\x9d\xa6\x9e\xb3\xe5\xc5\xc6')";
  if (script.find(kCurrentLiteral) != npos) return ScriptGeneration::kCurrent;
  if (script.find(kLegacyStartMarker) != npos) return ScriptGeneration::kLegacy;
  return ScriptGeneration::kUnknown;
}

bool script_writes_json_result(std::string_view script) {
  return script.find("_letta_json.dumps(result_ZQqiequkcFwRwwGQMqkt") != npos;
}

ParsedOutput parse_letta_stdout(std::string_view stdout_bytes, ScriptGeneration generation) {
  ParsedOutput r;
  const std::size_t binary_pos =
      generation == ScriptGeneration::kLegacy ? npos : stdout_bytes.find(kBinaryMarker);
  const std::size_t legacy_pos =
      generation == ScriptGeneration::kCurrent ? npos : stdout_bytes.find(kLegacyStartMarker);
  if (binary_pos == npos && legacy_pos == npos) {
    set_stdout(r, stdout_bytes);
    return r;
  }
  // The two markers cannot overlap (the binary one starts with byte 0x92,
  // the text one is ASCII), so "earlier" is well defined.
  if (binary_pos < legacy_pos) {
    parse_binary_frame(stdout_bytes, binary_pos, r);
  } else {
    parse_legacy_frame(stdout_bytes, legacy_pos, r);
  }
  return r;
}

Result<std::string> b64decode_validate(std::string_view s) {
  // base64._bytes_from_decode_data: a str must be ASCII.
  for (char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) {
      return Error::invalid("string argument should contain only ASCII characters");
    }
  }
  // binascii.a2b_base64(s, strict_mode=True) as in CPython 3.11.
  auto err = [](std::string_view m) { return Error::invalid(std::string(m)); };
  if (!s.empty() && s[0] == '=') return err("Leading padding not allowed");
  std::string out;
  out.reserve(s.size() / 4 * 3);
  int quad_pos = 0;
  int pads = 0;
  bool padding_started = false;
  unsigned leftchar = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char ch = s[i];
    if (ch == '=') {
      padding_started = true;
      // Padding is only meaningful after two or three data characters of a
      // quad; it ends the input once the quad is complete. Padding after a
      // complete quad is skipped, which 3.11 accepts ("QUFB=").
      if (quad_pos >= 2 && quad_pos + ++pads >= 4) {
        if (i + 1 < s.size()) return err("Excess data after padding");
        return out;
      }
      continue;
    }
    unsigned v;
    if (ch >= 'A' && ch <= 'Z') v = static_cast<unsigned>(ch - 'A');
    else if (ch >= 'a' && ch <= 'z') v = static_cast<unsigned>(ch - 'a' + 26);
    else if (ch >= '0' && ch <= '9') v = static_cast<unsigned>(ch - '0' + 52);
    else if (ch == '+') v = 62;
    else if (ch == '/') v = 63;
    else return err("Only base64 data is allowed");
    if (padding_started) return err("Discontinuous padding not allowed");
    pads = 0;
    switch (quad_pos) {
      case 0:
        quad_pos = 1;
        leftchar = v;
        break;
      case 1:
        quad_pos = 2;
        out += static_cast<char>((leftchar << 2) | (v >> 4));
        leftchar = v & 0x0F;
        break;
      case 2:
        quad_pos = 3;
        out += static_cast<char>(((leftchar << 4) | (v >> 2)) & 0xFF);
        leftchar = v & 0x03;
        break;
      default:
        quad_pos = 0;
        out += static_cast<char>(((leftchar << 6) | v) & 0xFF);
        leftchar = 0;
        break;
    }
  }
  if (quad_pos == 1) {
    return err("Invalid base64-encoded string: number of data characters (" +
               std::to_string(out.size() / 3 * 4 + 1) + ") cannot be 1 more than a multiple of 4");
  }
  if (quad_pos != 0) return err("Incorrect padding");
  return out;
}

std::string b64encode(std::string_view bytes) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  std::size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const std::uint32_t n = (std::uint32_t{static_cast<unsigned char>(bytes[i])} << 16) |
                            (std::uint32_t{static_cast<unsigned char>(bytes[i + 1])} << 8) |
                            std::uint32_t{static_cast<unsigned char>(bytes[i + 2])};
    out += kAlphabet[(n >> 18) & 63];
    out += kAlphabet[(n >> 12) & 63];
    out += kAlphabet[(n >> 6) & 63];
    out += kAlphabet[n & 63];
  }
  const std::size_t rest = bytes.size() - i;
  if (rest > 0) {
    std::uint32_t n = std::uint32_t{static_cast<unsigned char>(bytes[i])} << 16;
    if (rest == 2) n |= std::uint32_t{static_cast<unsigned char>(bytes[i + 1])} << 8;
    out += kAlphabet[(n >> 18) & 63];
    out += kAlphabet[(n >> 12) & 63];
    out += rest == 2 ? kAlphabet[(n >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

// ---------------------------------------------------------------------------
// Error strings
// ---------------------------------------------------------------------------

std::string friendly_error_msg(std::string_view function_name, std::string_view exception_name,
                               std::string_view message) {
  std::string msg = "Error executing function ";
  msg += utf8_decode_replace(function_name).text;
  msg += ": ";
  msg += utf8_decode_replace(exception_name).text;
  msg += ": ";
  msg += utf8_decode_replace(message).text;
  msg.resize(utf8_prefix_bytes(msg, kMaxErrorMessageChars));
  return msg;
}

std::pair<std::string, std::string> parse_stderr_error_msg(std::string_view stderr_text, int last_n_lines) {
  const std::string text = utf8_decode_replace(stderr_text).text;
  std::vector<std::string_view> lines;  // text.split("\n"): n separators give n + 1 fields
  std::size_t begin = 0;
  while (true) {
    const std::size_t nl = text.find('\n', begin);
    if (nl == npos) {
      lines.emplace_back(std::string_view(text).substr(begin));
      break;
    }
    lines.emplace_back(std::string_view(text).substr(begin, nl - begin));
    begin = nl + 1;
  }
  // lines[:index:-1] with index = -(last_n_lines + 1): PySlice_AdjustIndices
  // for a negative step (start defaults to len - 1; a negative stop is
  // counted from the end and clamped to -1; a stop past the end to len - 1).
  const auto len = static_cast<long long>(lines.size());
  long long stop = -(static_cast<long long>(last_n_lines) + 1);
  if (stop < 0) {
    stop += len;
    if (stop < 0) stop = -1;
  } else if (stop >= len) {
    stop = len - 1;
  }
  for (long long i = len - 1; i > stop; --i) {
    const std::string_view line = lines[static_cast<std::size_t>(i)];
    if (line.find("Error") == npos && line.find("Exception") == npos) continue;
    if (auto m = search_error_pattern(line)) return *m;
  }
  return {"", ""};
}

bool python_re_word_char(char32_t cp) { return in_word_table(cp); }

// ---------------------------------------------------------------------------
// Nonce frame
// ---------------------------------------------------------------------------

bool is_valid_nonce(std::string_view nonce) {
  return nonce.size() == kNonceHexChars &&
         std::all_of(nonce.begin(), nonce.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

Result<std::string> make_nonce_frame(std::string_view nonce, const nlohmann::json& payload) {
  if (!is_valid_nonce(nonce)) return Error::invalid("nonce must be 32 lowercase hex characters");
  std::string text;
  try {
    text = payload.dump(-1, ' ', /*ensure_ascii=*/true);
  } catch (const nlohmann::json::exception& e) {  // invalid UTF-8 in a string
    return Error::invalid(std::string("runner result frame: ") + e.what());
  }
  std::string frame = "\n";
  frame += kNonceFrameStart;
  frame += nonce;
  frame += kNonceFrameClose;
  frame += b64encode(text);
  frame += kNonceFrameEnd;
  frame += nonce;
  frame += kNonceFrameClose;
  frame += '\n';
  return frame;
}

namespace {

// A decoded pickle's "types" (letta.h, NonceFrame::types): entries of
// [path, tag, ...], each path an array of member names and indices.
bool valid_pickle_types(const nlohmann::json& entries) {
  if (!entries.is_array()) return false;
  for (const auto& e : entries) {
    if (!e.is_array() || e.size() < 2 || !e[0].is_array() || !e[1].is_string()) return false;
    for (const auto& step : e[0])
      if (!step.is_string() && !step.is_number_unsigned()) return false;
    const std::string& tag = e[1].get_ref<const std::string&>();
    bool ok = false;
    if (tag == "tuple") ok = e.size() == 2;
    else if (tag == "key")
      ok = e.size() == 3 && !e[0].empty() && e[0].back().is_string() && e[2].is_string() &&
           (e[2] == "int" || e[2] == "float" || e[2] == "bool" || e[2] == "none");
    else if (tag == "bytes" || tag == "bytearray") ok = e.size() == 3 && e[2].is_string();
    else if (tag == "set" || tag == "frozenset") ok = e.size() == 4 && e[2].is_string() && valid_pickle_types(e[3]);
    if (!ok) return false;
  }
  return true;
}

// The runner's payload (a frame's decoded base64, or the result channel's
// bytes), checked against the shape in letta.h. `what` starts each error.
Result<NonceFrame> parse_runner_payload(std::string_view text, std::string_view what) {
  auto bad = [&](std::string_view why) { return Error::invalid(std::string(what) + ": " + std::string(why), EBADMSG); };
  if (!json_nesting_within(text)) return bad("payload is nested too deeply");
  // The runner writes the payload with Python's json.dumps: non-finite
  // floats as NaN/Infinity and lone surrogates as \u escapes, which the
  // document below holds approximately (null, U+FFFD) and the exact text
  // keeps as they are.
  nlohmann::json payload = parse_json_bounded(text);
  if (payload.is_discarded())
    if (auto rewritten = rewrite_python_json_extensions(text)) payload = parse_json_bounded(*rewritten);
  if (payload.is_discarded()) return bad("payload is not JSON");
  if (!payload.is_object()) return bad("payload is not an object");
  for (auto it = payload.begin(); it != payload.end(); ++it) {
    if (it.key() != "results" && it.key() != "agent_state" && it.key() != "error" && it.key() != "types" &&
        it.key() != "types_omitted")
      return bad("unexpected payload key");
  }
  if (!payload.contains("results") || !payload.contains("agent_state")) {
    return bad("payload lacks \"results\" or \"agent_state\"");
  }

  NonceFrame f;
  f.results = std::move(payload["results"]);
  f.agent_state = std::move(payload["agent_state"]);
  const PayloadText exact = payload_text(text);
  f.results_text.assign(exact.results);
  if (exact.agent_state_kind == JsonKind::Object) f.agent_state_text.assign(exact.agent_state);
  if (!f.agent_state.is_null() && !f.agent_state.is_object()) return bad("agent_state is not an object");
  if (auto it = payload.find("types"); it != payload.end()) {
    if (!valid_pickle_types(*it)) return bad("types is malformed");
    f.types = std::move(*it);
  }
  if (auto it = payload.find("types_omitted"); it != payload.end()) {
    if (*it != true) return bad("types_omitted is not true");
    f.types_omitted = true;
  }
  if (auto it = payload.find("error"); it != payload.end()) {
    if (!it->is_object()) return bad("error is not an object");
    auto kind = get_string(*it, "kind");
    auto name = get_string(*it, "name");
    auto message = get_string(*it, "message");
    if (!kind || !name || !message || (*kind != "tool" && *kind != "request")) {
      return bad("error lacks a valid kind, name or message");
    }
    if (!f.results.is_null() || !f.agent_state.is_null()) return bad("error frame carries a result");
    bool raised = false;
    if (auto r = it->find("raised"); r != it->end()) {
      if (!r->is_boolean()) return bad("error.raised is not a boolean");
      raised = r->get<bool>();
    }
    f.error = RunnerError{std::move(*kind), std::move(*name), std::move(*message), raised};
  }
  return f;
}

void set_stdout_text(NonceFrame& f, std::string_view stdout_bytes) {
  auto text = utf8_decode_replace(stdout_bytes);
  f.stdout_text = std::move(text.text);
  f.stdout_invalid_utf8 = text.had_invalid;
  if (text.had_invalid) f.stdout_decode_error = python_utf8_decode_error(stdout_bytes);
}

}  // namespace

Result<std::optional<NonceFrame>> extract_nonce_frame(std::string_view stdout_bytes, std::string_view nonce) {
  if (!is_valid_nonce(nonce)) return Error::invalid("nonce must be 32 lowercase hex characters");
  std::string start_tok(kNonceFrameStart);
  start_tok += nonce;
  start_tok += kNonceFrameClose;
  std::string end_tok(kNonceFrameEnd);
  end_tok += nonce;
  end_tok += kNonceFrameClose;

  const std::size_t start = stdout_bytes.find(start_tok);
  if (start == npos) {
    if (stdout_bytes.find(end_tok) != npos) return bad_frame("end marker without a start marker");
    return std::optional<NonceFrame>{};
  }
  if (stdout_bytes.find(start_tok, start + 1) != npos) return bad_frame("start marker occurs more than once");
  const std::size_t body = start + start_tok.size();
  const std::size_t end = stdout_bytes.find(end_tok, body);
  if (end == npos) return bad_frame("unterminated (no end marker after the start marker)");
  if (stdout_bytes.find(end_tok, end + 1) != npos || stdout_bytes.substr(0, start).find(end_tok) != npos) {
    return bad_frame("end marker occurs more than once");
  }

  auto decoded = b64decode_validate(stdout_bytes.substr(body, end - body));
  if (!decoded.ok()) return std::move(decoded).error().wrap("runner result frame: base64");
  auto parsed = parse_runner_payload(*decoded, "runner result frame");
  // context: parse_runner_payload's messages begin with the name it was given
  if (!parsed.ok()) return std::move(parsed).error();
  NonceFrame f = std::move(parsed).value();

  // The runner writes one "\n" before and one after the frame so it sits on
  // its own line; those two bytes belong to the frame.
  std::string_view before = stdout_bytes.substr(0, start);
  std::string_view after = stdout_bytes.substr(end + end_tok.size());
  if (before.ends_with('\n')) before.remove_suffix(1);
  if (after.starts_with('\n')) after.remove_prefix(1);
  std::string rest(before);
  rest += after;
  set_stdout_text(f, rest);
  return std::optional<NonceFrame>(std::move(f));
}

// ---------------------------------------------------------------------------
// Result channel
// ---------------------------------------------------------------------------

std::optional<bool> parse_channel_declaration(std::string_view bytes) {
  if (bytes == kChannelDeclaredNo) return false;
  if (bytes == kChannelDeclaredYes) return true;
  return std::nullopt;
}

std::string big_endian_u32(std::uint32_t n) {
  return {static_cast<char>(n >> 24), static_cast<char>(n >> 16), static_cast<char>(n >> 8), static_cast<char>(n)};
}

std::string channel_part_header(std::size_t size) { return big_endian_u32(static_cast<std::uint32_t>(size)); }

Result<NonceFrame> parse_channel_result(std::string_view payload, std::string_view stdout_bytes) {
  auto parsed = parse_runner_payload(payload, "runner result");
  // context: parse_runner_payload's messages begin with the name it was given
  if (!parsed.ok()) return std::move(parsed).error();
  NonceFrame f = std::move(parsed).value();
  set_stdout_text(f, stdout_bytes);
  return f;
}

namespace {

// Code point ranges matched by Python's re \w in a str pattern (str.isalnum()
// or "_"), generated from CPython 3.11.2, Unicode 14.0.0:
//   [(a, b) for maximal runs of c in range(0x110000) if re.match(r"\w", chr(c))]
// tests/unit/letta_test.cc compares this table with the interpreter.
struct CpRange {
  std::uint32_t lo;
  std::uint32_t hi;
};
constexpr CpRange kWordRanges[] = {
    {0x30, 0x39}, {0x41, 0x5A}, {0x5F, 0x5F}, {0x61, 0x7A}, {0xAA, 0xAA}, {0xB2, 0xB3},
    {0xB5, 0xB5}, {0xB9, 0xBA}, {0xBC, 0xBE}, {0xC0, 0xD6}, {0xD8, 0xF6}, {0xF8, 0x2C1},
    {0x2C6, 0x2D1}, {0x2E0, 0x2E4}, {0x2EC, 0x2EC}, {0x2EE, 0x2EE}, {0x370, 0x374}, {0x376, 0x377},
    {0x37A, 0x37D}, {0x37F, 0x37F}, {0x386, 0x386}, {0x388, 0x38A}, {0x38C, 0x38C}, {0x38E, 0x3A1},
    {0x3A3, 0x3F5}, {0x3F7, 0x481}, {0x48A, 0x52F}, {0x531, 0x556}, {0x559, 0x559}, {0x560, 0x588},
    {0x5D0, 0x5EA}, {0x5EF, 0x5F2}, {0x620, 0x64A}, {0x660, 0x669}, {0x66E, 0x66F}, {0x671, 0x6D3},
    {0x6D5, 0x6D5}, {0x6E5, 0x6E6}, {0x6EE, 0x6FC}, {0x6FF, 0x6FF}, {0x710, 0x710}, {0x712, 0x72F},
    {0x74D, 0x7A5}, {0x7B1, 0x7B1}, {0x7C0, 0x7EA}, {0x7F4, 0x7F5}, {0x7FA, 0x7FA}, {0x800, 0x815},
    {0x81A, 0x81A}, {0x824, 0x824}, {0x828, 0x828}, {0x840, 0x858}, {0x860, 0x86A}, {0x870, 0x887},
    {0x889, 0x88E}, {0x8A0, 0x8C9}, {0x904, 0x939}, {0x93D, 0x93D}, {0x950, 0x950}, {0x958, 0x961},
    {0x966, 0x96F}, {0x971, 0x980}, {0x985, 0x98C}, {0x98F, 0x990}, {0x993, 0x9A8}, {0x9AA, 0x9B0},
    {0x9B2, 0x9B2}, {0x9B6, 0x9B9}, {0x9BD, 0x9BD}, {0x9CE, 0x9CE}, {0x9DC, 0x9DD}, {0x9DF, 0x9E1},
    {0x9E6, 0x9F1}, {0x9F4, 0x9F9}, {0x9FC, 0x9FC}, {0xA05, 0xA0A}, {0xA0F, 0xA10}, {0xA13, 0xA28},
    {0xA2A, 0xA30}, {0xA32, 0xA33}, {0xA35, 0xA36}, {0xA38, 0xA39}, {0xA59, 0xA5C}, {0xA5E, 0xA5E},
    {0xA66, 0xA6F}, {0xA72, 0xA74}, {0xA85, 0xA8D}, {0xA8F, 0xA91}, {0xA93, 0xAA8}, {0xAAA, 0xAB0},
    {0xAB2, 0xAB3}, {0xAB5, 0xAB9}, {0xABD, 0xABD}, {0xAD0, 0xAD0}, {0xAE0, 0xAE1}, {0xAE6, 0xAEF},
    {0xAF9, 0xAF9}, {0xB05, 0xB0C}, {0xB0F, 0xB10}, {0xB13, 0xB28}, {0xB2A, 0xB30}, {0xB32, 0xB33},
    {0xB35, 0xB39}, {0xB3D, 0xB3D}, {0xB5C, 0xB5D}, {0xB5F, 0xB61}, {0xB66, 0xB6F}, {0xB71, 0xB77},
    {0xB83, 0xB83}, {0xB85, 0xB8A}, {0xB8E, 0xB90}, {0xB92, 0xB95}, {0xB99, 0xB9A}, {0xB9C, 0xB9C},
    {0xB9E, 0xB9F}, {0xBA3, 0xBA4}, {0xBA8, 0xBAA}, {0xBAE, 0xBB9}, {0xBD0, 0xBD0}, {0xBE6, 0xBF2},
    {0xC05, 0xC0C}, {0xC0E, 0xC10}, {0xC12, 0xC28}, {0xC2A, 0xC39}, {0xC3D, 0xC3D}, {0xC58, 0xC5A},
    {0xC5D, 0xC5D}, {0xC60, 0xC61}, {0xC66, 0xC6F}, {0xC78, 0xC7E}, {0xC80, 0xC80}, {0xC85, 0xC8C},
    {0xC8E, 0xC90}, {0xC92, 0xCA8}, {0xCAA, 0xCB3}, {0xCB5, 0xCB9}, {0xCBD, 0xCBD}, {0xCDD, 0xCDE},
    {0xCE0, 0xCE1}, {0xCE6, 0xCEF}, {0xCF1, 0xCF2}, {0xD04, 0xD0C}, {0xD0E, 0xD10}, {0xD12, 0xD3A},
    {0xD3D, 0xD3D}, {0xD4E, 0xD4E}, {0xD54, 0xD56}, {0xD58, 0xD61}, {0xD66, 0xD78}, {0xD7A, 0xD7F},
    {0xD85, 0xD96}, {0xD9A, 0xDB1}, {0xDB3, 0xDBB}, {0xDBD, 0xDBD}, {0xDC0, 0xDC6}, {0xDE6, 0xDEF},
    {0xE01, 0xE30}, {0xE32, 0xE33}, {0xE40, 0xE46}, {0xE50, 0xE59}, {0xE81, 0xE82}, {0xE84, 0xE84},
    {0xE86, 0xE8A}, {0xE8C, 0xEA3}, {0xEA5, 0xEA5}, {0xEA7, 0xEB0}, {0xEB2, 0xEB3}, {0xEBD, 0xEBD},
    {0xEC0, 0xEC4}, {0xEC6, 0xEC6}, {0xED0, 0xED9}, {0xEDC, 0xEDF}, {0xF00, 0xF00}, {0xF20, 0xF33},
    {0xF40, 0xF47}, {0xF49, 0xF6C}, {0xF88, 0xF8C}, {0x1000, 0x102A}, {0x103F, 0x1049},
    {0x1050, 0x1055}, {0x105A, 0x105D}, {0x1061, 0x1061}, {0x1065, 0x1066}, {0x106E, 0x1070},
    {0x1075, 0x1081}, {0x108E, 0x108E}, {0x1090, 0x1099}, {0x10A0, 0x10C5}, {0x10C7, 0x10C7},
    {0x10CD, 0x10CD}, {0x10D0, 0x10FA}, {0x10FC, 0x1248}, {0x124A, 0x124D}, {0x1250, 0x1256},
    {0x1258, 0x1258}, {0x125A, 0x125D}, {0x1260, 0x1288}, {0x128A, 0x128D}, {0x1290, 0x12B0},
    {0x12B2, 0x12B5}, {0x12B8, 0x12BE}, {0x12C0, 0x12C0}, {0x12C2, 0x12C5}, {0x12C8, 0x12D6},
    {0x12D8, 0x1310}, {0x1312, 0x1315}, {0x1318, 0x135A}, {0x1369, 0x137C}, {0x1380, 0x138F},
    {0x13A0, 0x13F5}, {0x13F8, 0x13FD}, {0x1401, 0x166C}, {0x166F, 0x167F}, {0x1681, 0x169A},
    {0x16A0, 0x16EA}, {0x16EE, 0x16F8}, {0x1700, 0x1711}, {0x171F, 0x1731}, {0x1740, 0x1751},
    {0x1760, 0x176C}, {0x176E, 0x1770}, {0x1780, 0x17B3}, {0x17D7, 0x17D7}, {0x17DC, 0x17DC},
    {0x17E0, 0x17E9}, {0x17F0, 0x17F9}, {0x1810, 0x1819}, {0x1820, 0x1878}, {0x1880, 0x1884},
    {0x1887, 0x18A8}, {0x18AA, 0x18AA}, {0x18B0, 0x18F5}, {0x1900, 0x191E}, {0x1946, 0x196D},
    {0x1970, 0x1974}, {0x1980, 0x19AB}, {0x19B0, 0x19C9}, {0x19D0, 0x19DA}, {0x1A00, 0x1A16},
    {0x1A20, 0x1A54}, {0x1A80, 0x1A89}, {0x1A90, 0x1A99}, {0x1AA7, 0x1AA7}, {0x1B05, 0x1B33},
    {0x1B45, 0x1B4C}, {0x1B50, 0x1B59}, {0x1B83, 0x1BA0}, {0x1BAE, 0x1BE5}, {0x1C00, 0x1C23},
    {0x1C40, 0x1C49}, {0x1C4D, 0x1C7D}, {0x1C80, 0x1C88}, {0x1C90, 0x1CBA}, {0x1CBD, 0x1CBF},
    {0x1CE9, 0x1CEC}, {0x1CEE, 0x1CF3}, {0x1CF5, 0x1CF6}, {0x1CFA, 0x1CFA}, {0x1D00, 0x1DBF},
    {0x1E00, 0x1F15}, {0x1F18, 0x1F1D}, {0x1F20, 0x1F45}, {0x1F48, 0x1F4D}, {0x1F50, 0x1F57},
    {0x1F59, 0x1F59}, {0x1F5B, 0x1F5B}, {0x1F5D, 0x1F5D}, {0x1F5F, 0x1F7D}, {0x1F80, 0x1FB4},
    {0x1FB6, 0x1FBC}, {0x1FBE, 0x1FBE}, {0x1FC2, 0x1FC4}, {0x1FC6, 0x1FCC}, {0x1FD0, 0x1FD3},
    {0x1FD6, 0x1FDB}, {0x1FE0, 0x1FEC}, {0x1FF2, 0x1FF4}, {0x1FF6, 0x1FFC}, {0x2070, 0x2071},
    {0x2074, 0x2079}, {0x207F, 0x2089}, {0x2090, 0x209C}, {0x2102, 0x2102}, {0x2107, 0x2107},
    {0x210A, 0x2113}, {0x2115, 0x2115}, {0x2119, 0x211D}, {0x2124, 0x2124}, {0x2126, 0x2126},
    {0x2128, 0x2128}, {0x212A, 0x212D}, {0x212F, 0x2139}, {0x213C, 0x213F}, {0x2145, 0x2149},
    {0x214E, 0x214E}, {0x2150, 0x2189}, {0x2460, 0x249B}, {0x24EA, 0x24FF}, {0x2776, 0x2793},
    {0x2C00, 0x2CE4}, {0x2CEB, 0x2CEE}, {0x2CF2, 0x2CF3}, {0x2CFD, 0x2CFD}, {0x2D00, 0x2D25},
    {0x2D27, 0x2D27}, {0x2D2D, 0x2D2D}, {0x2D30, 0x2D67}, {0x2D6F, 0x2D6F}, {0x2D80, 0x2D96},
    {0x2DA0, 0x2DA6}, {0x2DA8, 0x2DAE}, {0x2DB0, 0x2DB6}, {0x2DB8, 0x2DBE}, {0x2DC0, 0x2DC6},
    {0x2DC8, 0x2DCE}, {0x2DD0, 0x2DD6}, {0x2DD8, 0x2DDE}, {0x2E2F, 0x2E2F}, {0x3005, 0x3007},
    {0x3021, 0x3029}, {0x3031, 0x3035}, {0x3038, 0x303C}, {0x3041, 0x3096}, {0x309D, 0x309F},
    {0x30A1, 0x30FA}, {0x30FC, 0x30FF}, {0x3105, 0x312F}, {0x3131, 0x318E}, {0x3192, 0x3195},
    {0x31A0, 0x31BF}, {0x31F0, 0x31FF}, {0x3220, 0x3229}, {0x3248, 0x324F}, {0x3251, 0x325F},
    {0x3280, 0x3289}, {0x32B1, 0x32BF}, {0x3400, 0x4DBF}, {0x4E00, 0xA48C}, {0xA4D0, 0xA4FD},
    {0xA500, 0xA60C}, {0xA610, 0xA62B}, {0xA640, 0xA66E}, {0xA67F, 0xA69D}, {0xA6A0, 0xA6EF},
    {0xA717, 0xA71F}, {0xA722, 0xA788}, {0xA78B, 0xA7CA}, {0xA7D0, 0xA7D1}, {0xA7D3, 0xA7D3},
    {0xA7D5, 0xA7D9}, {0xA7F2, 0xA801}, {0xA803, 0xA805}, {0xA807, 0xA80A}, {0xA80C, 0xA822},
    {0xA830, 0xA835}, {0xA840, 0xA873}, {0xA882, 0xA8B3}, {0xA8D0, 0xA8D9}, {0xA8F2, 0xA8F7},
    {0xA8FB, 0xA8FB}, {0xA8FD, 0xA8FE}, {0xA900, 0xA925}, {0xA930, 0xA946}, {0xA960, 0xA97C},
    {0xA984, 0xA9B2}, {0xA9CF, 0xA9D9}, {0xA9E0, 0xA9E4}, {0xA9E6, 0xA9FE}, {0xAA00, 0xAA28},
    {0xAA40, 0xAA42}, {0xAA44, 0xAA4B}, {0xAA50, 0xAA59}, {0xAA60, 0xAA76}, {0xAA7A, 0xAA7A},
    {0xAA7E, 0xAAAF}, {0xAAB1, 0xAAB1}, {0xAAB5, 0xAAB6}, {0xAAB9, 0xAABD}, {0xAAC0, 0xAAC0},
    {0xAAC2, 0xAAC2}, {0xAADB, 0xAADD}, {0xAAE0, 0xAAEA}, {0xAAF2, 0xAAF4}, {0xAB01, 0xAB06},
    {0xAB09, 0xAB0E}, {0xAB11, 0xAB16}, {0xAB20, 0xAB26}, {0xAB28, 0xAB2E}, {0xAB30, 0xAB5A},
    {0xAB5C, 0xAB69}, {0xAB70, 0xABE2}, {0xABF0, 0xABF9}, {0xAC00, 0xD7A3}, {0xD7B0, 0xD7C6},
    {0xD7CB, 0xD7FB}, {0xF900, 0xFA6D}, {0xFA70, 0xFAD9}, {0xFB00, 0xFB06}, {0xFB13, 0xFB17},
    {0xFB1D, 0xFB1D}, {0xFB1F, 0xFB28}, {0xFB2A, 0xFB36}, {0xFB38, 0xFB3C}, {0xFB3E, 0xFB3E},
    {0xFB40, 0xFB41}, {0xFB43, 0xFB44}, {0xFB46, 0xFBB1}, {0xFBD3, 0xFD3D}, {0xFD50, 0xFD8F},
    {0xFD92, 0xFDC7}, {0xFDF0, 0xFDFB}, {0xFE70, 0xFE74}, {0xFE76, 0xFEFC}, {0xFF10, 0xFF19},
    {0xFF21, 0xFF3A}, {0xFF41, 0xFF5A}, {0xFF66, 0xFFBE}, {0xFFC2, 0xFFC7}, {0xFFCA, 0xFFCF},
    {0xFFD2, 0xFFD7}, {0xFFDA, 0xFFDC}, {0x10000, 0x1000B}, {0x1000D, 0x10026}, {0x10028, 0x1003A},
    {0x1003C, 0x1003D}, {0x1003F, 0x1004D}, {0x10050, 0x1005D}, {0x10080, 0x100FA},
    {0x10107, 0x10133}, {0x10140, 0x10178}, {0x1018A, 0x1018B}, {0x10280, 0x1029C},
    {0x102A0, 0x102D0}, {0x102E1, 0x102FB}, {0x10300, 0x10323}, {0x1032D, 0x1034A},
    {0x10350, 0x10375}, {0x10380, 0x1039D}, {0x103A0, 0x103C3}, {0x103C8, 0x103CF},
    {0x103D1, 0x103D5}, {0x10400, 0x1049D}, {0x104A0, 0x104A9}, {0x104B0, 0x104D3},
    {0x104D8, 0x104FB}, {0x10500, 0x10527}, {0x10530, 0x10563}, {0x10570, 0x1057A},
    {0x1057C, 0x1058A}, {0x1058C, 0x10592}, {0x10594, 0x10595}, {0x10597, 0x105A1},
    {0x105A3, 0x105B1}, {0x105B3, 0x105B9}, {0x105BB, 0x105BC}, {0x10600, 0x10736},
    {0x10740, 0x10755}, {0x10760, 0x10767}, {0x10780, 0x10785}, {0x10787, 0x107B0},
    {0x107B2, 0x107BA}, {0x10800, 0x10805}, {0x10808, 0x10808}, {0x1080A, 0x10835},
    {0x10837, 0x10838}, {0x1083C, 0x1083C}, {0x1083F, 0x10855}, {0x10858, 0x10876},
    {0x10879, 0x1089E}, {0x108A7, 0x108AF}, {0x108E0, 0x108F2}, {0x108F4, 0x108F5},
    {0x108FB, 0x1091B}, {0x10920, 0x10939}, {0x10980, 0x109B7}, {0x109BC, 0x109CF},
    {0x109D2, 0x10A00}, {0x10A10, 0x10A13}, {0x10A15, 0x10A17}, {0x10A19, 0x10A35},
    {0x10A40, 0x10A48}, {0x10A60, 0x10A7E}, {0x10A80, 0x10A9F}, {0x10AC0, 0x10AC7},
    {0x10AC9, 0x10AE4}, {0x10AEB, 0x10AEF}, {0x10B00, 0x10B35}, {0x10B40, 0x10B55},
    {0x10B58, 0x10B72}, {0x10B78, 0x10B91}, {0x10BA9, 0x10BAF}, {0x10C00, 0x10C48},
    {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x10CFA, 0x10D23}, {0x10D30, 0x10D39},
    {0x10E60, 0x10E7E}, {0x10E80, 0x10EA9}, {0x10EB0, 0x10EB1}, {0x10F00, 0x10F27},
    {0x10F30, 0x10F45}, {0x10F51, 0x10F54}, {0x10F70, 0x10F81}, {0x10FB0, 0x10FCB},
    {0x10FE0, 0x10FF6}, {0x11003, 0x11037}, {0x11052, 0x1106F}, {0x11071, 0x11072},
    {0x11075, 0x11075}, {0x11083, 0x110AF}, {0x110D0, 0x110E8}, {0x110F0, 0x110F9},
    {0x11103, 0x11126}, {0x11136, 0x1113F}, {0x11144, 0x11144}, {0x11147, 0x11147},
    {0x11150, 0x11172}, {0x11176, 0x11176}, {0x11183, 0x111B2}, {0x111C1, 0x111C4},
    {0x111D0, 0x111DA}, {0x111DC, 0x111DC}, {0x111E1, 0x111F4}, {0x11200, 0x11211},
    {0x11213, 0x1122B}, {0x11280, 0x11286}, {0x11288, 0x11288}, {0x1128A, 0x1128D},
    {0x1128F, 0x1129D}, {0x1129F, 0x112A8}, {0x112B0, 0x112DE}, {0x112F0, 0x112F9},
    {0x11305, 0x1130C}, {0x1130F, 0x11310}, {0x11313, 0x11328}, {0x1132A, 0x11330},
    {0x11332, 0x11333}, {0x11335, 0x11339}, {0x1133D, 0x1133D}, {0x11350, 0x11350},
    {0x1135D, 0x11361}, {0x11400, 0x11434}, {0x11447, 0x1144A}, {0x11450, 0x11459},
    {0x1145F, 0x11461}, {0x11480, 0x114AF}, {0x114C4, 0x114C5}, {0x114C7, 0x114C7},
    {0x114D0, 0x114D9}, {0x11580, 0x115AE}, {0x115D8, 0x115DB}, {0x11600, 0x1162F},
    {0x11644, 0x11644}, {0x11650, 0x11659}, {0x11680, 0x116AA}, {0x116B8, 0x116B8},
    {0x116C0, 0x116C9}, {0x11700, 0x1171A}, {0x11730, 0x1173B}, {0x11740, 0x11746},
    {0x11800, 0x1182B}, {0x118A0, 0x118F2}, {0x118FF, 0x11906}, {0x11909, 0x11909},
    {0x1190C, 0x11913}, {0x11915, 0x11916}, {0x11918, 0x1192F}, {0x1193F, 0x1193F},
    {0x11941, 0x11941}, {0x11950, 0x11959}, {0x119A0, 0x119A7}, {0x119AA, 0x119D0},
    {0x119E1, 0x119E1}, {0x119E3, 0x119E3}, {0x11A00, 0x11A00}, {0x11A0B, 0x11A32},
    {0x11A3A, 0x11A3A}, {0x11A50, 0x11A50}, {0x11A5C, 0x11A89}, {0x11A9D, 0x11A9D},
    {0x11AB0, 0x11AF8}, {0x11C00, 0x11C08}, {0x11C0A, 0x11C2E}, {0x11C40, 0x11C40},
    {0x11C50, 0x11C6C}, {0x11C72, 0x11C8F}, {0x11D00, 0x11D06}, {0x11D08, 0x11D09},
    {0x11D0B, 0x11D30}, {0x11D46, 0x11D46}, {0x11D50, 0x11D59}, {0x11D60, 0x11D65},
    {0x11D67, 0x11D68}, {0x11D6A, 0x11D89}, {0x11D98, 0x11D98}, {0x11DA0, 0x11DA9},
    {0x11EE0, 0x11EF2}, {0x11FB0, 0x11FB0}, {0x11FC0, 0x11FD4}, {0x12000, 0x12399},
    {0x12400, 0x1246E}, {0x12480, 0x12543}, {0x12F90, 0x12FF0}, {0x13000, 0x1342E},
    {0x14400, 0x14646}, {0x16800, 0x16A38}, {0x16A40, 0x16A5E}, {0x16A60, 0x16A69},
    {0x16A70, 0x16ABE}, {0x16AC0, 0x16AC9}, {0x16AD0, 0x16AED}, {0x16B00, 0x16B2F},
    {0x16B40, 0x16B43}, {0x16B50, 0x16B59}, {0x16B5B, 0x16B61}, {0x16B63, 0x16B77},
    {0x16B7D, 0x16B8F}, {0x16E40, 0x16E96}, {0x16F00, 0x16F4A}, {0x16F50, 0x16F50},
    {0x16F93, 0x16F9F}, {0x16FE0, 0x16FE1}, {0x16FE3, 0x16FE3}, {0x17000, 0x187F7},
    {0x18800, 0x18CD5}, {0x18D00, 0x18D08}, {0x1AFF0, 0x1AFF3}, {0x1AFF5, 0x1AFFB},
    {0x1AFFD, 0x1AFFE}, {0x1B000, 0x1B122}, {0x1B150, 0x1B152}, {0x1B164, 0x1B167},
    {0x1B170, 0x1B2FB}, {0x1BC00, 0x1BC6A}, {0x1BC70, 0x1BC7C}, {0x1BC80, 0x1BC88},
    {0x1BC90, 0x1BC99}, {0x1D2E0, 0x1D2F3}, {0x1D360, 0x1D378}, {0x1D400, 0x1D454},
    {0x1D456, 0x1D49C}, {0x1D49E, 0x1D49F}, {0x1D4A2, 0x1D4A2}, {0x1D4A5, 0x1D4A6},
    {0x1D4A9, 0x1D4AC}, {0x1D4AE, 0x1D4B9}, {0x1D4BB, 0x1D4BB}, {0x1D4BD, 0x1D4C3},
    {0x1D4C5, 0x1D505}, {0x1D507, 0x1D50A}, {0x1D50D, 0x1D514}, {0x1D516, 0x1D51C},
    {0x1D51E, 0x1D539}, {0x1D53B, 0x1D53E}, {0x1D540, 0x1D544}, {0x1D546, 0x1D546},
    {0x1D54A, 0x1D550}, {0x1D552, 0x1D6A5}, {0x1D6A8, 0x1D6C0}, {0x1D6C2, 0x1D6DA},
    {0x1D6DC, 0x1D6FA}, {0x1D6FC, 0x1D714}, {0x1D716, 0x1D734}, {0x1D736, 0x1D74E},
    {0x1D750, 0x1D76E}, {0x1D770, 0x1D788}, {0x1D78A, 0x1D7A8}, {0x1D7AA, 0x1D7C2},
    {0x1D7C4, 0x1D7CB}, {0x1D7CE, 0x1D7FF}, {0x1DF00, 0x1DF1E}, {0x1E100, 0x1E12C},
    {0x1E137, 0x1E13D}, {0x1E140, 0x1E149}, {0x1E14E, 0x1E14E}, {0x1E290, 0x1E2AD},
    {0x1E2C0, 0x1E2EB}, {0x1E2F0, 0x1E2F9}, {0x1E7E0, 0x1E7E6}, {0x1E7E8, 0x1E7EB},
    {0x1E7ED, 0x1E7EE}, {0x1E7F0, 0x1E7FE}, {0x1E800, 0x1E8C4}, {0x1E8C7, 0x1E8CF},
    {0x1E900, 0x1E943}, {0x1E94B, 0x1E94B}, {0x1E950, 0x1E959}, {0x1EC71, 0x1ECAB},
    {0x1ECAD, 0x1ECAF}, {0x1ECB1, 0x1ECB4}, {0x1ED01, 0x1ED2D}, {0x1ED2F, 0x1ED3D},
    {0x1EE00, 0x1EE03}, {0x1EE05, 0x1EE1F}, {0x1EE21, 0x1EE22}, {0x1EE24, 0x1EE24},
    {0x1EE27, 0x1EE27}, {0x1EE29, 0x1EE32}, {0x1EE34, 0x1EE37}, {0x1EE39, 0x1EE39},
    {0x1EE3B, 0x1EE3B}, {0x1EE42, 0x1EE42}, {0x1EE47, 0x1EE47}, {0x1EE49, 0x1EE49},
    {0x1EE4B, 0x1EE4B}, {0x1EE4D, 0x1EE4F}, {0x1EE51, 0x1EE52}, {0x1EE54, 0x1EE54},
    {0x1EE57, 0x1EE57}, {0x1EE59, 0x1EE59}, {0x1EE5B, 0x1EE5B}, {0x1EE5D, 0x1EE5D},
    {0x1EE5F, 0x1EE5F}, {0x1EE61, 0x1EE62}, {0x1EE64, 0x1EE64}, {0x1EE67, 0x1EE6A},
    {0x1EE6C, 0x1EE72}, {0x1EE74, 0x1EE77}, {0x1EE79, 0x1EE7C}, {0x1EE7E, 0x1EE7E},
    {0x1EE80, 0x1EE89}, {0x1EE8B, 0x1EE9B}, {0x1EEA1, 0x1EEA3}, {0x1EEA5, 0x1EEA9},
    {0x1EEAB, 0x1EEBB}, {0x1F100, 0x1F10C}, {0x1FBF0, 0x1FBF9}, {0x20000, 0x2A6DF},
    {0x2A700, 0x2B738}, {0x2B740, 0x2B81D}, {0x2B820, 0x2CEA1}, {0x2CEB0, 0x2EBE0},
    {0x2F800, 0x2FA1D}, {0x30000, 0x3134A},
};

bool in_word_table(char32_t cp) {
  const auto it = std::upper_bound(std::begin(kWordRanges), std::end(kWordRanges), static_cast<std::uint32_t>(cp),
                                   [](std::uint32_t v, const CpRange& r) { return v < r.lo; });
  return it != std::begin(kWordRanges) && static_cast<std::uint32_t>(cp) <= std::prev(it)->hi;
}

}  // namespace
}  // namespace tsb::letta
