#include "daemon/frontend/letta/pyjson.h"

#include "protocol/json_scan.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

namespace tsb::letta {
namespace {

// One step of a UTF-8 decoder that follows the Unicode "maximal subpart"
// practice (Unicode 15, section 3.9, U+FFFD substitution), which is what
// CPython's "replace" error handler does: an invalid lead byte is one error;
// a valid lead followed by a byte outside its allowed range is one error
// covering only the bytes accepted so far. The second-byte ranges exclude
// overlongs (E0 A0.., F0 90..), surrogates (ED ..9F) and values above
// U+10FFFF (F4 ..8F).
struct Step {
  char32_t cp = 0;
  std::size_t len = 1;
  bool ok = false;
};

Step decode_step(std::string_view s, std::size_t i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) return {b0, 1, true};
  int need = 0;
  char32_t cp = 0;
  unsigned char lo = 0x80;
  unsigned char hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
    cp = b0 & 0x1F;
  } else if (b0 == 0xE0) {
    need = 2;
    cp = b0 & 0x0F;
    lo = 0xA0;
  } else if (b0 == 0xED) {
    need = 2;
    cp = b0 & 0x0F;
    hi = 0x9F;
  } else if (b0 >= 0xE1 && b0 <= 0xEF) {
    need = 2;
    cp = b0 & 0x0F;
  } else if (b0 == 0xF0) {
    need = 3;
    cp = b0 & 0x07;
    lo = 0x90;
  } else if (b0 >= 0xF1 && b0 <= 0xF3) {
    need = 3;
    cp = b0 & 0x07;
  } else if (b0 == 0xF4) {
    need = 3;
    cp = b0 & 0x07;
    hi = 0x8F;
  } else {
    return {0, 1, false};  // 80..C1 (continuation or overlong lead), F5..FF
  }
  std::size_t j = i + 1;
  for (int k = 0; k < need; ++k, ++j) {
    if (j >= s.size()) return {0, j - i, false};
    const auto b = static_cast<unsigned char>(s[j]);
    if (b < lo || b > hi) return {0, j - i, false};
    lo = 0x80;
    hi = 0xBF;
    cp = (cp << 6) | (b & 0x3F);
  }
  return {cp, j - i, true};
}

void append_u_escape(std::string& out, unsigned v) {
  static constexpr char kHex[] = "0123456789abcdef";  // json.dumps writes lowercase
  out += "\\u";
  out += kHex[(v >> 12) & 0xF];
  out += kHex[(v >> 8) & 0xF];
  out += kHex[(v >> 4) & 0xF];
  out += kHex[v & 0xF];
}

// The ensure_ascii string encoder (py_encode_basestring_ascii in CPython's
// Modules/_json.c): printable ASCII other than '"' and '\\' passes through,
// five controls get short escapes, everything else becomes \uXXXX.
Status append_py_string(std::string& out, std::string_view s, std::string_view what) {
  out += '"';
  std::size_t i = 0;
  while (i < s.size()) {
    const Step st = decode_step(s, i);
    if (!st.ok) {
      return Error::invalid(std::string(what) + " is not valid UTF-8 (byte offset " +
                            std::to_string(i) + ")");
    }
    i += st.len;
    const char32_t c = st.cp;
    switch (c) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      default: break;
    }
    if (c >= 0x20 && c < 0x7F) {
      out += static_cast<char>(c);
    } else if (c >= 0x10000) {
      const char32_t v = c - 0x10000;
      append_u_escape(out, 0xD800 | (v >> 10));
      append_u_escape(out, 0xDC00 | (v & 0x3FF));
    } else {
      append_u_escape(out, c);
    }
  }
  out += '"';
  return {};
}

// float.__repr__ through json's floatstr: the non-finite values get the
// JavaScript spellings json.dumps uses instead of repr's "inf"/"nan".
void append_py_float(std::string& out, double d) {
  if (std::isnan(d)) {
    out += "NaN";  // Python ignores the sign of a NaN here
  } else if (std::isinf(d)) {
    out += d < 0 ? "-Infinity" : "Infinity";
  } else {
    out += python_float_repr(d);
  }
}

struct Style {
  bool sort_keys;
  std::string_view item_sep;
  std::string_view key_sep;
};

template <class J>
Status dump_value(const J& v, const Style& style, int depth, std::string& out) {
  using value_t = nlohmann::detail::value_t;
  switch (v.type()) {
    case value_t::null:
      out += "null";
      return {};
    case value_t::boolean:
      out += v.template get<bool>() ? "true" : "false";
      return {};
    case value_t::number_integer:
      out += std::to_string(v.template get<std::int64_t>());
      return {};
    case value_t::number_unsigned:
      out += std::to_string(v.template get<std::uint64_t>());
      return {};
    case value_t::number_float:
      append_py_float(out, v.template get<double>());
      return {};
    case value_t::string:
      return append_py_string(out, v.template get_ref<const std::string&>(), "string value");
    case value_t::array: {
      if (depth >= kMaxDumpDepth) return Error::invalid("nesting deeper than " + std::to_string(kMaxDumpDepth));
      out += '[';
      bool first = true;
      for (const auto& e : v) {
        if (!first) out += style.item_sep;
        first = false;
        TSB_TRY(dump_value(e, style, depth + 1, out), "array element");
      }
      out += ']';
      return {};
    }
    case value_t::object: {
      if (depth >= kMaxDumpDepth) return Error::invalid("nesting deeper than " + std::to_string(kMaxDumpDepth));
      std::vector<std::pair<const std::string*, const J*>> items;
      items.reserve(v.size());
      for (auto it = v.begin(); it != v.end(); ++it) items.emplace_back(&it.key(), &it.value());
      if (style.sort_keys) {
        // std::string compares as unsigned char, i.e. UTF-8 byte order, which
        // equals code point order (Python's str order).
        std::stable_sort(items.begin(), items.end(),
                         [](const auto& a, const auto& b) { return *a.first < *b.first; });
      }
      out += '{';
      bool first = true;
      for (const auto& [key, val] : items) {
        if (!first) out += style.item_sep;
        first = false;
        TSB_TRY(append_py_string(out, *key, "object key"), "object");
        out += style.key_sep;
        TSB_TRY(dump_value(*val, style, depth + 1, out), "value of a key");
      }
      out += '}';
      return {};
    }
    case value_t::binary:
      return Error::invalid("binary values are not JSON serializable");
    case value_t::discarded:
    default:
      return Error::invalid("discarded value is not JSON serializable");
  }
}

template <class J>
Result<std::string> dump_with(const J& v, const Style& style) {
  std::string out;
  auto st = dump_value(v, style, 0, out);
  if (!st.ok()) return std::move(st).error().wrap("json.dumps");
  return out;
}

constexpr Style kCompactSorted{true, ",", ":"};
constexpr Style kPythonDefault{false, ", ", ": "};

}  // namespace

Result<std::string> dumps_compact_sorted(const nlohmann::json& v) { return dump_with(v, kCompactSorted); }
Result<std::string> dumps_compact_sorted(const nlohmann::ordered_json& v) {
  return dump_with(v, kCompactSorted);
}
Result<std::string> dumps_python_default(const nlohmann::json& v) { return dump_with(v, kPythonDefault); }
Result<std::string> dumps_python_default(const nlohmann::ordered_json& v) {
  return dump_with(v, kPythonDefault);
}

std::string python_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";

  // std::to_chars without a precision yields the shortest representation that
  // round-trips, choosing the closest one on ties; that is also what CPython's
  // repr gets from dtoa mode 0. Take its digits and exponent, then lay them
  // out the way float_repr_style 'short' does (Python/pystrtod.c).
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string_view sci(buf, static_cast<std::size_t>(res.ptr - buf));  // [-]D[.DDD]e(+|-)XX

  std::string out;
  if (sci.front() == '-') {
    out += '-';
    sci.remove_prefix(1);
  }
  const auto epos = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, epos)) {
    if (c != '.') digits += c;
  }
  int exp10 = 0;
  const auto exp_sv = sci.substr(epos + 1);
  std::from_chars(exp_sv.data() + (exp_sv.front() == '+' ? 1 : 0), exp_sv.data() + exp_sv.size(), exp10);
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();

  // decpt: position of the decimal point relative to the first digit.
  const int decpt = exp10 + 1;
  const int n = static_cast<int>(digits.size());
  if (decpt <= -4 || decpt > 16) {
    out += digits[0];
    if (n > 1) {
      out += '.';
      out.append(digits, 1, std::string::npos);
    }
    const int e = decpt - 1;
    out += e < 0 ? "e-" : "e+";
    const int ae = e < 0 ? -e : e;
    if (ae < 10) out += '0';  // at least two exponent digits: 1e-05, 1e+16
    out += std::to_string(ae);
  } else if (decpt <= 0) {
    out += "0.";
    out.append(static_cast<std::size_t>(-decpt), '0');
    out += digits;
  } else if (decpt >= n) {
    out += digits;
    out.append(static_cast<std::size_t>(decpt - n), '0');
    out += ".0";
  } else {
    out.append(digits, 0, static_cast<std::size_t>(decpt));
    out += '.';
    out.append(digits, static_cast<std::size_t>(decpt), std::string::npos);
  }
  return out;
}

Utf8Text utf8_decode_replace(std::string_view bytes) {
  Utf8Text r;
  r.text.reserve(bytes.size());
  std::size_t i = 0;
  while (i < bytes.size()) {
    const Step st = decode_step(bytes, i);
    if (st.ok) {
      r.text.append(bytes.data() + i, st.len);
    } else {
      r.text += "\xEF\xBF\xBD";  // U+FFFD
      r.had_invalid = true;
    }
    i += st.len;
  }
  return r;
}

bool is_valid_utf8(std::string_view bytes) {
  std::size_t i = 0;
  while (i < bytes.size()) {
    const Step st = decode_step(bytes, i);
    if (!st.ok) return false;
    i += st.len;
  }
  return true;
}

std::size_t utf8_prefix_bytes(std::string_view valid_utf8, std::size_t max_code_points) {
  std::size_t i = 0;
  std::size_t count = 0;
  while (i < valid_utf8.size() && count < max_code_points) {
    ++i;
    // Skip continuation bytes so the cut lands on a sequence boundary.
    while (i < valid_utf8.size() && (static_cast<unsigned char>(valid_utf8[i]) & 0xC0) == 0x80) ++i;
    ++count;
  }
  return i;
}

char32_t utf8_next(std::string_view valid_utf8, std::size_t& pos) {
  const Step st = decode_step(valid_utf8, pos);
  pos += st.len;
  return st.ok ? st.cp : U'\uFFFD';
}

std::string python_json_as_strict(std::string_view text) {
  std::string out;
  std::size_t copied = 0;
  protocol::JsonScanOptions o;
  o.python_values = true;
  o.duplicate_keys = false;
  o.on_number = [&](std::string_view tok) {
    if (tok.empty() || (tok.back() != 'N' && tok.back() != 'y')) return;  // NaN, [-]Infinity
    const auto at = static_cast<std::size_t>(tok.data() - text.data());
    out.append(text.substr(copied, at - copied));
    out += '"';
    out.append(tok);
    out += '"';
    copied = at + tok.size();
  };
  if (!std::holds_alternative<protocol::JsonScanned>(protocol::scan_json(text, o))) return std::string(text);
  if (copied == 0 && out.empty()) return std::string(text);
  out.append(text.substr(copied));
  return out;
}

}  // namespace tsb::letta
