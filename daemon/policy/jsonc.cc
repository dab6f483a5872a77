#include "daemon/policy/jsonc.h"
#include "daemon/common/quote.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <limits>
#include <new>
#include <optional>
#include <utility>

namespace tsb {
namespace {


// Characters that make text display differently from how it parses
// ("Trojan Source", CVE-2021-42574): an auditor reading a policy in an editor
// must see what the parser sees, so these are refused even in comments.

std::string hex_cp(char32_t cp) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "U+%04X", static_cast<unsigned>(cp));
  return buf;
}

std::string format_location(std::string_view source, JsonLocation at) {
  std::string s(source);
  s += ':';
  s += std::to_string(at.line);
  s += ':';
  s += std::to_string(at.col);
  return s;
}

class Parser {
 public:
  Parser(std::string_view text, LocatedJson& out) : t_(text), out_(out) {}

  bool parse_document() {
    if (!validate_text()) return false;
    if (!skip_blank()) return false;
    if (at_end()) return fail(here(), "empty document, expected a JSON value");
    if (!parse_value(out_.value, "", 0)) return false;
    if (!skip_blank()) return false;
    if (!at_end()) return fail(here(), "unexpected " + describe_here() + " after the top-level value");
    return true;
  }

  Error take_error() { return std::move(*error_); }

 private:
  std::string_view t_;
  std::size_t i_ = 0;
  int line_ = 1;
  int col_ = 1;
  LocatedJson& out_;
  std::optional<Error> error_;

  [[nodiscard]] bool at_end() const { return i_ >= t_.size(); }
  [[nodiscard]] char peek() const { return t_[i_]; }
  [[nodiscard]] bool peek_is(std::string_view s) const { return t_.substr(i_, s.size()) == s; }
  [[nodiscard]] JsonLocation here() const { return {line_, col_}; }

  void bump() {
    const auto c = static_cast<unsigned char>(t_[i_++]);
    if (c == '\n') {
      ++line_;
      col_ = 1;
    } else if ((c & 0xC0) != 0x80) {
      ++col_;  // count code points: continuation bytes do not start a column
    }
  }

  bool fail(JsonLocation at, std::string_view sentence) {
    error_ = Error::invalid(format_location(out_.source, at) + ": " + std::string(sentence));
    return false;
  }

  // "character 'x'" or "end of input", for messages about what was found.
  [[nodiscard]] std::string describe_here() const {
    if (at_end()) return "end of input";
    char32_t cp = 0;
    const std::size_t n = decode_utf8(t_, i_, cp);
    std::string_view ch = t_.substr(i_, n == 0 ? 1 : n);
    if (cp < 0x20 || cp == 0x7F) return "character " + hex_cp(cp);
    return "character '" + std::string(ch) + "'";
  }

  // One pass over the raw bytes before any parsing, so every later step may
  // assume well-formed UTF-8 without control characters outside \t \n \r.
  bool validate_text() {
    if (t_.substr(0, 3) == "\xEF\xBB\xBF") return fail(here(), "byte order mark (U+FEFF) not allowed");
    while (!at_end()) {
      char32_t cp = 0;
      const std::size_t n = decode_utf8(t_, i_, cp);
      if (n == 0) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "0x%02X", static_cast<unsigned>(static_cast<unsigned char>(peek())));
        return fail(here(), std::string("invalid UTF-8 (byte ") + buf + ")");
      }
      if ((cp < 0x20 && cp != '\t' && cp != '\n' && cp != '\r') || (cp >= 0x80 && cp <= 0x9F)) {
        return fail(here(), "control character " + hex_cp(cp) + " not allowed");
      }
      if (is_bidi_control(cp)) {
        return fail(here(), "bidirectional control character " + hex_cp(cp) +
                                " not allowed (it makes text display differently from how it parses)");
      }
      for (std::size_t k = 0; k < n; ++k) bump();
    }
    i_ = 0;
    line_ = 1;
    col_ = 1;
    return true;
  }

  // Whitespace (the four JSON allows) and comments.
  bool skip_blank() {
    while (!at_end()) {
      const char c = peek();
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        bump();
      } else if (peek_is("//")) {
        while (!at_end() && peek() != '\n') bump();
      } else if (peek_is("/*")) {
        const JsonLocation start = here();
        bump();
        bump();
        while (!at_end() && !peek_is("*/")) bump();
        if (at_end()) return fail(start, "unterminated /* comment");
        bump();
        bump();
      } else {
        break;
      }
    }
    return true;
  }

  bool parse_value(nlohmann::json& out, const std::string& ptr, int depth) {
    const JsonLocation at = here();
    out_.locations[ptr] = at;
    if (at_end()) return fail(at, "unexpected end of input, expected a JSON value");
    const char c = peek();
    if (c == '{' || c == '[') {
      if (depth + 1 > kMaxJsonDepth) {
        return fail(at, "nesting deeper than " + std::to_string(kMaxJsonDepth) + " levels");
      }
      return c == '{' ? parse_object(out, ptr, depth + 1) : parse_array(out, ptr, depth + 1);
    }
    if (c == '"') {
      std::string s;
      if (!parse_string(s)) return false;
      out = std::move(s);
      return true;
    }
    if (c == '-' || (c >= '0' && c <= '9')) return parse_number(out);
    if (peek_is("true")) return literal("true", out, true);
    if (peek_is("false")) return literal("false", out, false);
    if (peek_is("null")) return literal("null", out, nullptr);
    if (peek_is("NaN") || peek_is("Infinity")) {
      return fail(at, "NaN and Infinity are not valid JSON numbers");
    }
    return fail(at, "unexpected " + describe_here() + ", expected a JSON value");
  }

  bool literal(std::string_view word, nlohmann::json& out, nlohmann::json v) {
    for (std::size_t k = 0; k < word.size(); ++k) bump();
    // "nullx", "true1": the word must end where a token may end.
    if (!at_end()) {
      const char c = peek();
      if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_') {
        return fail(here(), "unexpected " + describe_here() + " after '" + std::string(word) + "'");
      }
    }
    out = std::move(v);
    return true;
  }

  bool parse_object(nlohmann::json& out, const std::string& ptr, int depth) {
    out = nlohmann::json::object();
    bump();  // '{'
    if (!skip_blank()) return false;
    if (!at_end() && peek() == '}') {
      bump();
      return true;
    }
    while (true) {
      if (at_end() || peek() != '"') {
        if (!at_end() && peek() == '}') return fail(here(), "trailing comma before '}'");
        return fail(here(), "unexpected " + describe_here() + ", expected a string as object key");
      }
      const JsonLocation key_at = here();
      std::string key;
      if (!parse_string(key)) return false;
      std::string child = json_pointer_append(ptr, key);
      if (out.contains(key)) {
        const JsonLocation first = out_.key_locations[child];
        return fail(key_at, "duplicate key " + quoted_for_message(key) + "; first defined at " +
                                std::to_string(first.line) + ":" + std::to_string(first.col));
      }
      out_.key_locations[child] = key_at;
      if (!skip_blank()) return false;
      if (at_end() || peek() != ':') {
        return fail(here(), "unexpected " + describe_here() + ", expected ':' after object key");
      }
      bump();
      if (!skip_blank()) return false;
      if (!parse_value(out[key], child, depth)) return false;
      if (!skip_blank()) return false;
      if (!at_end() && peek() == ',') {
        bump();
        if (!skip_blank()) return false;
        continue;
      }
      if (!at_end() && peek() == '}') {
        bump();
        return true;
      }
      return fail(here(), "unexpected " + describe_here() + ", expected ',' or '}' after object member");
    }
  }

  bool parse_array(nlohmann::json& out, const std::string& ptr, int depth) {
    out = nlohmann::json::array();
    bump();  // '['
    if (!skip_blank()) return false;
    if (!at_end() && peek() == ']') {
      bump();
      return true;
    }
    for (std::size_t index = 0;; ++index) {
      if (!at_end() && peek() == ']') return fail(here(), "trailing comma before ']'");
      nlohmann::json element;
      if (!parse_value(element, json_pointer_append(ptr, index), depth)) return false;
      out.push_back(std::move(element));
      if (!skip_blank()) return false;
      if (!at_end() && peek() == ',') {
        bump();
        if (!skip_blank()) return false;
        continue;
      }
      if (!at_end() && peek() == ']') {
        bump();
        return true;
      }
      return fail(here(), "unexpected " + describe_here() + ", expected ',' or ']' after array element");
    }
  }

  static void append_utf8(std::string& s, char32_t cp) {
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else if (cp < 0x800) {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      s += static_cast<char>(0xE0 | (cp >> 12));
      s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      s += static_cast<char>(0xF0 | (cp >> 18));
      s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  bool parse_hex4(char32_t& v) {
    v = 0;
    for (int k = 0; k < 4; ++k) {
      if (at_end()) return false;
      const char c = peek();
      unsigned d = 0;
      if (c >= '0' && c <= '9') d = static_cast<unsigned>(c - '0');
      else if (c >= 'a' && c <= 'f') d = static_cast<unsigned>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') d = static_cast<unsigned>(c - 'A' + 10);
      else return false;
      v = (v << 4) | d;
      bump();
    }
    return true;
  }

  bool parse_string(std::string& s) {
    const JsonLocation start = here();
    bump();  // '"'
    while (true) {
      if (at_end()) return fail(start, "unterminated string");
      const char c = peek();
      if (c == '"') {
        bump();
        return true;
      }
      if (static_cast<unsigned char>(c) < 0x20) {
        if (c == '\n') return fail(start, "unterminated string (raw line break inside a string)");
        return fail(here(), "control character " + hex_cp(static_cast<unsigned char>(c)) +
                                " in a string must be escaped");
      }
      if (c != '\\') {
        s += c;
        bump();
        continue;
      }
      const JsonLocation esc_at = here();
      bump();
      if (at_end()) return fail(start, "unterminated string");
      const char e = peek();
      bump();
      switch (e) {
        case '"': s += '"'; break;
        case '\\': s += '\\'; break;
        case '/': s += '/'; break;
        case 'b': s += '\b'; break;
        case 'f': s += '\f'; break;
        case 'n': s += '\n'; break;
        case 'r': s += '\r'; break;
        case 't': s += '\t'; break;
        case 'u': {
          char32_t cp = 0;
          if (!parse_hex4(cp)) return fail(esc_at, "invalid \\u escape (expected four hex digits)");
          if (cp >= 0xDC00 && cp <= 0xDFFF) return fail(esc_at, "unpaired UTF-16 surrogate in \\u escape");
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            char32_t lo = 0;
            if (!peek_is("\\u")) return fail(esc_at, "unpaired UTF-16 surrogate in \\u escape");
            bump();
            bump();
            if (!parse_hex4(lo)) return fail(esc_at, "invalid \\u escape (expected four hex digits)");
            if (lo < 0xDC00 || lo > 0xDFFF) return fail(esc_at, "unpaired UTF-16 surrogate in \\u escape");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          append_utf8(s, cp);
          break;
        }
        default: {
          std::string shown(1, e);
          if (static_cast<unsigned char>(e) < 0x20 || static_cast<unsigned char>(e) >= 0x7F) shown = "?";
          return fail(esc_at, "invalid escape '\\" + shown + "' in string");
        }
      }
    }
  }

  // JSON number grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
  bool parse_number(nlohmann::json& out) {
    const JsonLocation start = here();
    const std::size_t begin = i_;
    const bool negative = peek() == '-';
    if (negative) {
      bump();
      if (peek_is("Infinity")) return fail(start, "NaN and Infinity are not valid JSON numbers");
    }
    const auto digit = [&] { return !at_end() && peek() >= '0' && peek() <= '9'; };
    if (!digit()) return fail(here(), "unexpected " + describe_here() + ", expected a digit");
    if (peek() == '0') {
      bump();
      if (digit()) return fail(start, "leading zeros are not allowed in numbers");
    } else {
      while (digit()) bump();
    }
    bool integral = true;
    if (!at_end() && peek() == '.') {
      integral = false;
      bump();
      if (!digit()) return fail(here(), "unexpected " + describe_here() + ", expected a digit after '.'");
      while (digit()) bump();
    }
    if (!at_end() && (peek() == 'e' || peek() == 'E')) {
      integral = false;
      bump();
      if (!at_end() && (peek() == '+' || peek() == '-')) bump();
      if (!digit()) return fail(here(), "unexpected " + describe_here() + ", expected a digit in exponent");
      while (digit()) bump();
    }
    const std::string_view text = t_.substr(begin, i_ - begin);
    if (integral) {
      const std::string_view digits = negative ? text.substr(1) : text;
      std::uint64_t magnitude = 0;
      const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), magnitude);
      constexpr std::uint64_t kMinMagnitude = std::uint64_t{1} << 63;
      if (ec != std::errc{} || end != digits.data() + digits.size() || (negative && magnitude > kMinMagnitude)) {
        return fail(start, "integer " + std::string(text) + " out of range (must fit in 64 bits)");
      }
      if (!negative) {
        out = static_cast<nlohmann::json::number_unsigned_t>(magnitude);
      } else if (magnitude == kMinMagnitude) {
        out = std::numeric_limits<std::int64_t>::min();
      } else {
        out = -static_cast<std::int64_t>(magnitude);
      }
      return true;
    }
    double d = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), d);
    if (ec != std::errc{} || end != text.data() + text.size() || !std::isfinite(d)) {
      return fail(start, "number " + std::string(text) + " out of range");
    }
    out = d;
    return true;
  }
};

}  // namespace

std::string json_pointer_append(std::string_view pointer, std::string_view token) {
  std::string s(pointer);
  s += '/';
  for (const char c : token) {
    if (c == '~') s += "~0";
    else if (c == '/') s += "~1";
    else s += c;
  }
  return s;
}

std::string json_pointer_append(std::string_view pointer, std::size_t index) {
  std::string s(pointer);
  s += '/';
  s += std::to_string(index);
  return s;
}

std::string LocatedJson::where(const std::string& pointer) const {
  if (const auto it = locations.find(pointer); it != locations.end()) {
    return format_location(source, it->second);
  }
  return source + ": " + (pointer.empty() ? std::string("(document root)") : pointer);
}

std::string LocatedJson::where_key(const std::string& pointer) const {
  if (const auto it = key_locations.find(pointer); it != key_locations.end()) {
    return format_location(source, it->second);
  }
  return where(pointer);
}

Status ObjectReader::object(std::string_view what) const {
  if (v_.is_object()) return {};
  return Error::invalid(doc_.where(ptr_) + ": " + std::string(what) + " must be an object");
}

const nlohmann::json* ObjectReader::get(std::string_view key) {
  if (std::find(seen_.begin(), seen_.end(), key) == seen_.end()) seen_.emplace_back(key);
  if (!v_.is_object()) return nullptr;
  auto it = v_.find(key);
  return it == v_.end() ? nullptr : &*it;
}

Error ObjectReader::error(std::string_view key, std::string_view sentence) const {
  return Error::invalid(where(key) + ": " + std::string(sentence));
}

Result<std::string> ObjectReader::string(std::string_view key, const std::string& dflt, bool absolute_path) {
  const nlohmann::json* x = get(key);
  if (!x || x->is_null()) return dflt;
  if (!x->is_string()) return error(key, "must be a string");
  std::string s = x->get<std::string>();
  if (absolute_path && (s.empty() || s[0] != '/')) return error(key, "must be an absolute path");
  return s;
}

Result<bool> ObjectReader::boolean(std::string_view key, bool dflt) {
  const nlohmann::json* x = get(key);
  if (!x) return dflt;
  if (!x->is_boolean()) return error(key, "must be true or false");
  return x->get<bool>();
}

Result<std::uint64_t> ObjectReader::number(std::string_view key, std::uint64_t dflt, std::uint64_t lo, std::uint64_t hi) {
  const nlohmann::json* x = get(key);
  if (!x) return dflt;
  if (!x->is_number_unsigned() || x->get<std::uint64_t>() < lo || x->get<std::uint64_t>() > hi)
    return error(key, "must be a whole number between " + std::to_string(lo) + " and " + std::to_string(hi));
  return x->get<std::uint64_t>();
}

Result<std::vector<std::string>> ObjectReader::strings(std::string_view key, std::string_view each) {
  std::vector<std::string> out;
  const nlohmann::json* x = get(key);
  if (!x) return out;
  if (!x->is_array()) return error(key, "must be an array of " + std::string(each));
  for (const auto& e : *x) {
    if (!e.is_string()) return error(key, "must be an array of " + std::string(each));
    out.push_back(e.get<std::string>());
  }
  return out;
}

Status ObjectReader::done() const {
  if (!v_.is_object()) return {};
  for (auto it = v_.begin(); it != v_.end(); ++it) {
    if (std::find(seen_.begin(), seen_.end(), it.key()) != seen_.end()) continue;
    std::string known;
    for (const auto& k : seen_) known += (known.empty() ? "" : ", ") + k;
    return Error::invalid(doc_.where_key(pointer(it.key())) + ": unknown key " + quoted_for_message(it.key()) +
                          " (known here: " + known + ")");
  }
  return {};
}

Result<LocatedJson> parse_jsonc(std::string_view text, std::string_view source) {
  // nlohmann::json throws only on allocation failure here; it must not cross
  // the module boundary.
  try {
    LocatedJson out;
    out.source.assign(source);
    Parser parser(text, out);
    if (!parser.parse_document()) return parser.take_error();
    return out;
  } catch (const std::bad_alloc&) {
    return Error::invalid(std::string(source) + ": out of memory while parsing", ENOMEM);
  } catch (const std::exception& e) {
    return Error::invalid(std::string(source) + ": " + e.what());
  }
}

}  // namespace tsb
